"""What a worker instance registers in discovery (wire type)."""

from __future__ import annotations

import msgspec


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
