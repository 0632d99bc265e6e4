"""Worker control calls on the request plane (wire types): change role, check the block pool,
measure a KV-transfer link, bring offloaded weights back.

A worker serves them at ``InstanceInfo.metadata["control_address"]``; each call streams back
exactly one ``ControlReply``.
"""

from __future__ import annotations

import msgspec

CONTROL_ENDPOINT = "interlock.worker.control"

OPS = ("status", "set_role", "check_integrity", "measure_link", "load_weights")


class ControlRequest(msgspec.Struct, frozen=True, kw_only=True):
    op: str
    """One of ``OPS``."""
    role: str = ""
    """``set_role``: the new role ("prefill", "decode" or "both")."""
    peer_address: str = ""
    """``measure_link``: the peer's KV-transfer agent (``host:port``)."""
    grace_s: float = 30.0
    """``set_role``: how long in-flight requests may take to finish before they are aborted."""


class ControlReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    role: str = ""
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    in_flight: int = 0
    integrity_error: str = ""
    """``check_integrity``: empty when the block pool passed."""
    live_transfers: int = 0
    """KV payloads this worker still stages or pulls."""
    pulls_by_transport: dict[str, int] = {}
    """KV pulls this worker completed or failed, by transport (inproc, shm, tcp)."""
    bandwidth_bytes_per_s: float = 0.0
    rtt_s: float = 0.0
    transport: str = ""
    weights_load_s: float = 0.0
    """``load_weights``: seconds the offloaded weights took to load (0: they were in)."""
