"""KV events and load reports published by workers on the event plane (wire types).

Modelled on vLLM's KV events: a worker publishes one ``KVEventBatch`` per engine step that had
changes, with a per-worker sequence number so subscribers can detect gaps and ask for a re-sync.
Block hashes are ``interlock.kvhash`` hashes.

Tiers: a worker's KV lives in the device pool and, when configured, in host memory and on disk
below it (``interlock.engine.tiers``). ``BlockStored``/``BlockRemoved`` name the tier they are
about (``TIERS``); a block may be in several tiers at once, and each tier's events are
independent. ``AllBlocksCleared`` clears every tier of the worker.
"""

from __future__ import annotations

import msgspec

TIERS = ("device", "host", "disk")
"""Tier names, fastest first."""


class BlockStored(msgspec.Struct, frozen=True, tag="stored", kw_only=True):
    """Blocks now cached, as hashes only. vLLM's event also lists the blocks' token ids; no
    reader here needs them (the router indexes hashes), and they were most of the bytes and of
    the decoding: a 128-block event 8.6 → 2.5 KB, 36 → 6 µs to decode. An older worker's
    ``token_ids`` are skipped unread."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    """Hash of the block before the first one here; None for a sequence's first block."""
    block_size: int = 16
    tier: str = "device"
    """One of ``TIERS``."""


class BlockRemoved(msgspec.Struct, frozen=True, tag="removed", kw_only=True):
    block_hashes: tuple[int, ...]
    tier: str = "device"


class AllBlocksCleared(msgspec.Struct, frozen=True, tag="cleared"):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    seq: int
    """Per-instance, starts at 0, +1 per batch. A snapshot (re-sync) batch has ``snapshot=True``."""
    timestamp: float
    events: tuple[KVEvent, ...]
    snapshot: bool = False
    """True: the events describe the worker's whole cache (after an AllBlocksCleared)."""


class TierStats(msgspec.Struct, frozen=True, kw_only=True):
    """Figures of one KV tier below the device pool (counters since the worker started)."""

    tier: str
    blocks: int
    capacity: int
    hits: int = 0
    """Blocks a prefix lookup found here."""
    loads: int = 0
    """Blocks loaded back into the device pool."""
    load_failures: int = 0
    """Blocks that could not be loaded (bad checksum, missing file): computed again."""
    load_s: float = 0.0
    """Total seconds spent loading."""
    load_s_per_block: float = 0.0
    """Measured seconds to load one block (moving average; 0 until measured)."""
    stores: int = 0
    evictions: int = 0
    load_timeouts: int = 0
    """Blocks of loads abandoned at their deadline (a stuck or very slow disk): computed."""
    write_failures: int = 0
    """Blocks that could not be written (disk full, I/O error): not stored, nothing lost."""


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: str
    timestamp: float
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    queued_prefill_tokens: int
    """Prompt tokens admitted or waiting that are not yet computed."""
    step_time_s: float
    """Duration of the last engine step."""
    tokens_computed: int
    """Tokens computed in the last step (prefill + decode)."""
    prefill_tokens_per_s: float = 0.0
    """Measured prefill speed (moving average), 0 if not yet measured."""
    decode_step_s: float = 0.0
    """Measured time of one decode step at the current batch (moving average)."""
    draining: bool = False
    held_s: float = 0.0
    """Seconds the worker held this report before sending it (``engine/pacing.py``): it shows
    the worker as it was that long before it arrived."""
    busy_s: float = 0.0
    """Seconds the engine has spent in steps since it started (its device's busy time:
    ``rate()`` of it is the device utilisation)."""
    kv_tiers: tuple[TierStats, ...] = ()
    """The worker's KV tiers below the device pool, fastest first (empty: none)."""
    weights_load_s: float = 0.0
    """While the model's weights are out (an idle model offloaded them, ``offload_after_s``):
    the seconds the next request waits for them to load again (the last load measured, or
    the first); 0 while they are in. The router adds it to the worker's cost."""
    kv_handoffs: tuple[tuple[str, int], ...] = ()
    """A guest engine's own KV hand-offs since it started, by outcome (vLLM's NIXL connector:
    ``nixl_prefills`` handed over, ``nixl_pulls`` received, ``nixl_failed`` pulls that failed
    and were computed locally instead); empty for Interlock's engine (``engine.disagg``)."""

    @property
    def kv_usage(self) -> float:
        """KV blocks in use over the pool, 0..1 (0 for an empty pool)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class RouterLoadEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Dispatch-time load one router shares with the others (several frontends side by side):
    ``kind`` is "route" (request sent to ``instance_id``), "first_token" (its prefill is done)
    or "finish" (it ended). Lets routers count each other's in-flight work before the next
    LoadReport."""

    router_id: str
    instance_id: str
    request_id: str
    kind: str
    timestamp: float
    prefill_tokens: int = 0
    """Uncached prompt tokens this request adds to the worker's prefill queue."""
    kv_tokens: int = 0
    """KV tokens the request will hold (prompt + expected output)."""
