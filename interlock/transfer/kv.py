"""Glue between a model runner's block export/import and a transfer, without copies of our own.

The source exports straight into the staged payload; the destination imports straight from the
received payload (for shared memory and in-process: from the source's own pages). Runners are
typed structurally, so this package does not import the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer.agent import TransferAgent
from interlock.transfer.base import (
    DEFAULT_TIMEOUT_S,
    DestTransfer,
    SourceTransfer,
    TransferState,
    TransferStatus,
)


class BlockExporter(Protocol):
    kv_block_nbytes: int

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None: ...


class BlockImporter(Protocol):
    kv_block_nbytes: int

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None: ...


def stage_blocks(
    agent: TransferAgent,
    runner: BlockExporter,
    block_ids: Sequence[int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transfer_id: str | None = None,
) -> tuple[SourceTransfer, TransferDescriptor]:
    """Export ``block_ids`` into a new staged payload and publish it. The blocks may be freed
    as soon as this returns: the payload holds their KV."""
    src = agent.create_source(
        len(block_ids) * runner.kv_block_nbytes, timeout_s=timeout_s, transfer_id=transfer_id
    )
    try:
        runner.export_blocks(block_ids, src.buffer)
        return src, src.publish()
    except BaseException:
        src.abort("export failed")
        raise


def import_when_done(dst: DestTransfer, runner: BlockImporter, block_ids: Sequence[int]) -> TransferStatus:
    """Poll once; on DONE import the payload into ``block_ids`` and release it. Returns the
    status (DONE only after the import)."""
    status = dst.poll()
    if status.state is TransferState.DONE:
        try:
            runner.import_blocks(block_ids, dst.payload)
        except BaseException:
            dst.abort("import failed")
            raise
        dst.release()
    return status
