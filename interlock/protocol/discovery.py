"""What a worker instance registers in discovery (wire type), and what a sane one looks like."""

from __future__ import annotations

import re

import msgspec

from interlock.names import ROLES

NAME_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A name token on the planes (instance ids, endpoint parts): NATS-safe, no wildcards."""
MAX_CONTEXT_LENGTH = 1 << 24
MAX_BLOCK_SIZE = 4096
MAX_KV_BLOCKS = 1 << 31
MAX_MODEL_NAME = 256
ADDRESS_SCHEMES = ("tcp://", "nats-rp://", "inproc://")
_TCP_ADDRESS = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})/[A-Za-z0-9_.-]+$")


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    endpoint: str
    """``namespace.component.endpoint`` it serves."""
    model: str
    """Served model name (what clients put in ``model``)."""
    model_path: str = ""
    """Local folder with tokenizer files and chat template, for the frontend."""
    role: str = "both"
    """"both", "prefill" or "decode"."""
    address: str = ""
    """Request-plane address (transport specific), e.g. ``tcp://127.0.0.1:40123``."""
    block_size: int = 16
    kv_blocks_total: int = 0
    context_length: int = 2048
    publishes_kv_events: bool = True
    queue_depth_threshold: int = 0
    """The router counts this worker busy while more requests than this wait in its queue (its
    reported ``num_waiting``, plus what was sent since that report); 0: no threshold."""
    metadata: dict[str, str] = {}


def instance_problem(info: InstanceInfo) -> str | None:
    """Why a registration cannot be a real worker (None: it can). Routers refuse those: a
    context length of 10**9 would otherwise reach every client as the model's limit."""
    if not NAME_TOKEN.match(info.instance_id):
        return "instance_id is not a name token"
    if not info.model or len(info.model) > MAX_MODEL_NAME or not info.model.isprintable():
        return f"model name must be 1..{MAX_MODEL_NAME} printable characters"
    if info.role not in ROLES:
        return f"role must be one of {', '.join(ROLES)}"
    if not 1 <= info.context_length <= MAX_CONTEXT_LENGTH:
        return f"context_length {info.context_length} outside 1..{MAX_CONTEXT_LENGTH}"
    if not 1 <= info.block_size <= MAX_BLOCK_SIZE:
        return f"block_size {info.block_size} outside 1..{MAX_BLOCK_SIZE}"
    if not 0 <= info.kv_blocks_total <= MAX_KV_BLOCKS:
        return f"kv_blocks_total {info.kv_blocks_total} outside 0..{MAX_KV_BLOCKS}"
    if not info.address.startswith(ADDRESS_SCHEMES):
        return f"address {info.address[:80]!r} is not a request-plane address"
    if info.address.startswith("tcp://"):
        match = _TCP_ADDRESS.match(info.address)
        if match is None or not 0 < int(match.group(2)) < 65536:
            return f"malformed TCP address {info.address[:80]!r}"
    return None
