"""The Llama-family model in plain PyTorch over a paged KV cache (used by the torch runner)."""

from interlock.engine.model.batch import ModelInput, SequenceChunk, build_input
from interlock.engine.model.config import ModelArchConfig, RopeScaling
from interlock.engine.model.kv_cache import PagedKVCache, block_nbytes, blocks_for_budget
from interlock.engine.model.llama import LlamaModel

__all__ = [
    "LlamaModel",
    "ModelArchConfig",
    "ModelInput",
    "PagedKVCache",
    "RopeScaling",
    "SequenceChunk",
    "block_nbytes",
    "blocks_for_budget",
    "build_input",
]
