"""KV transfer: move a staged payload of KV blocks between workers, started, polled and aborted
from the engine step loop without ever blocking it. See ``base`` for the interface and
``agent`` for how a transport (in-process, shared memory, TCP) is chosen."""

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer.agent import TransferAgent
from interlock.transfer.base import (
    DEFAULT_TIMEOUT_S,
    TRANSPORTS,
    DestTransfer,
    SourceTransfer,
    TransferState,
    TransferStatus,
)
from interlock.transfer.kv import BlockExport, BlockImport, import_when_done, publish_blocks, stage_blocks
from interlock.transfer.link import LinkStats, measure_link

__all__ = [
    "BlockExport",
    "BlockImport",
    "DEFAULT_TIMEOUT_S",
    "TRANSPORTS",
    "DestTransfer",
    "LinkStats",
    "SourceTransfer",
    "TransferAgent",
    "TransferDescriptor",
    "TransferState",
    "TransferStatus",
    "import_when_done",
    "measure_link",
    "publish_blocks",
    "stage_blocks",
]
