"""Wire types: frozen msgspec structs that cross process boundaries. No state, no I/O."""

from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    LoadReport,
    TierStats,
)
from interlock.protocol.generate import (
    ErrorInfo,
    GenerateOutput,
    GenerateRequest,
    KVTransferParams,
    TokenLogprobs,
)
from interlock.protocol.sampling import SamplingParams, StructuredOutput

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ErrorInfo",
    "GenerateOutput",
    "GenerateRequest",
    "InstanceInfo",
    "KVEvent",
    "KVEventBatch",
    "KVTransferParams",
    "LoadReport",
    "SamplingParams",
    "StructuredOutput",
    "TierStats",
    "TokenLogprobs",
]
