"""Which worker holds which cached KV blocks: the router's prefix index.

Idea: block hashes (``interlock.kvhash``) are chained, so a hash names a whole prefix and a flat
map ``hash -> workers holding it`` is a radix tree in disguise. Each worker gets a slot, and the
holders of a block are one Python ``int`` used as a bitmask over slots: a lookup walks the
request's hash chain AND-ing masks, so the cost is one dict probe and one big-int AND per block
whatever the number of workers. Per-worker overlap (longest cached prefix, in blocks) is where
each worker drops out of the nested masks (``dropouts``, ``overlap_of``); as a vector over all
workers, how many of the masks hold each slot, all unpacked in one pass (``fill_by_depth``).

Blocks stored together by the same workers share one mask object (``_store`` and ``_remove``
reuse the result for a run of blocks whose masks were one object), so the lookup skips the AND
for a block whose mask is the previous block's object: a long cached prefix costs little more
than one dict probe per block.

Two sources of truth, chosen per worker automatically:

* **events**: the worker publishes ``KVEventBatch`` messages. Sequence numbers are checked per
  worker: a batch at or below the last applied one is a duplicate (ignored); a batch past the
  next expected one means batches were lost, so the worker is flagged ``needs_resync`` (the glue
  asks it for a snapshot: a ``snapshot=True`` batch that starts with ``AllBlocksCleared``). A
  worker that says it publishes events starts flagged, so joining and router start-up re-sync.
  Live batches after a snapshot continue from the snapshot's seq + 1 (a snapshot may take a
  seq of its own, as the engine worker's does, or repeat that of the last live batch it
  includes, -1 if none, as the simulator's does).
* **approx**: a worker that publishes nothing (``publishes_kv_events=False``, or no batch seen
  yet) is predicted from the router's own decisions: the blocks of each request routed to it
  are assumed cached for ``approx_ttl_s``. The first batch from a worker switches it to events
  for good and drops the predictions.

Pending prefixes (events mode): a request routed to a worker will leave its prompt's blocks
there, but the worker says so only once its prefill has computed them; a request sharing that
prefix decided meanwhile (a follow-up, the next question over the same documents, a crowd
behind one new prompt) would see it nowhere and compute it again elsewhere. So the blocks of
each request routed that its worker does not hold are counted as held at once
(``record_pending``), until the worker's events store them (or remove them) or
``pending_ttl_s`` passes, when those it never stored (a request refused, cancelled or failed)
are taken out again (``expire_pending``). They are the router's guess, never the worker's
state: a replica's copy (``export``) leaves them out.

KV tiers: events name a tier (``device``, ``host``, ``disk``). Device blocks are the index
above; blocks a worker holds in a lower tier go to a second map of the same kind
(``lower holders``), so ``lower_overlaps`` can say, per worker, how many blocks right after
its device-pool prefix it could load from host or disk instead of computing them (what the
engine does: its lookup continues below the pool where the pool's hits end).

Compiled map: where ``interlock.router.native`` loads, the device map ``hash -> holders``
lives in C (``csrc/kvindex.c``: the same masks as bitsets in an open-addressing table) instead of
the dict, and the router's ``kv`` decision runs lookup, cost and choice in one call over it
(``native_decide``); ``overlap_masks`` and the rest give the same answers from either map. The
compiled map keeps each worker's device blocks too (a set per slot, 8 bytes a block; the dict
path's per-worker dicts took about 90 with their ints: 800 MB of a frontend's 1.16 GB at 300 x
30,000 blocks); the lower tiers stay in Python. The compiled map holds 64-bit
unsigned hashes (what ``kvhash`` makes); a batch naming another int is refused by name
(``TransportError``) before anything of it is applied, and a lookup stops at one, which no
worker can hold. ``compiled=False``, no compiler, or ``INTERLOCK_CPU_KERNELS=0``: the dict.

Invariants (``check_integrity``): a slot's bit is set in ``holders[h]`` iff ``h`` is in that
slot's block set (and likewise for lower tiers); no mask is zero; approximate entries exist
only for approx workers.
"""

from __future__ import annotations

import enum
import itertools
from array import array
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from interlock.errors import TransportError
from interlock.protocol.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from interlock.router import native


class ApplyResult(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    """Seq at or below the last applied one: ignored."""
    GAP = "gap"
    """Batches were lost: applied best-effort, worker flagged for a snapshot."""
    UNKNOWN_WORKER = "unknown_worker"


@dataclass(slots=True)
class _Worker:
    instance_id: str
    slot: int
    publishes_events: bool
    blocks: dict[int, None] = field(default_factory=dict)
    """The worker's device blocks, where the map is the dict (the compiled map keeps each slot's
    blocks itself: 8 bytes a block against about 90 here). A dict as a set: one of ints and None
    the garbage collector does not track, where a set is traversed on every full collection,
    0.34 s at 300 workers x 30,000 blocks: a stall of every request in flight
    (``benchmarks/index_costs.py``)."""
    last_seq: int | None = None
    """Last applied batch's seq; None until the first batch or snapshot."""
    events_seen: bool = False
    needs_resync: bool = False
    approx_expiry: dict[int, float] = field(default_factory=dict)
    """Approx mode: block hash -> time its prediction expires."""
    lower: dict[int, int] = field(default_factory=dict)
    """Block hash -> bits of the lower tiers holding it (``_TIER_BITS``)."""
    pending: dict[int, float] = field(default_factory=dict)
    """Events mode: device blocks of requests routed here that the worker has not yet said it
    stored (hash -> when the guess expires), held in the map meanwhile (``record_pending``)."""


_TIER_BITS = {"host": 1, "disk": 2}
STATE_STEP = 4096
"""Blocks of a worker's pulled state applied per slice (``load_state``): about 1 ms."""
TIDY_SLOTS = 1 << 18
"""Slots of a growing compiled map moved per ``tidy`` (2.3 ms on a Xeon; the router tidies every
0.5 s, so an old table of 8 M slots is gone within 16 s, sooner as stores move more)."""


class KvIndexer:
    """Prefix index over all workers. Pure data structure: no I/O, time passed in."""

    def __init__(
        self, *, approx_ttl_s: float = 120.0, pending_ttl_s: float = 30.0, compiled: bool = True
    ) -> None:
        self.approx_ttl_s = approx_ttl_s
        self.pending_ttl_s = pending_ttl_s
        """How long a routed request's blocks count as held before the worker's events say so
        (0: not at all)."""
        self._holders: dict[int, int] = {}
        """The device map in Python (unused while the compiled one is)."""
        self._c = native.load() if compiled else None
        """The compiled module (``native``), None: the dict is the map."""
        self._cmap = self._c.new(1) if self._c is not None else None
        self._cwords = 1
        """Slots the compiled map's masks have room for, in 64s."""
        self._settle: Callable[[dict[int, float], Sequence[int]], None] = (
            self._c.settle if self._c is not None else _settle
        )
        """Pending guesses the worker's events named, dropped (``_settle``; in C with the map)."""
        self.native_decide: Callable[..., tuple[int, list[int]]] | None = (
            partial(self._c.decide, self._cmap) if self._c is not None else None
        )
        """The whole ``kv`` decision over the compiled map (``csrc/kvindex.c``, ``decide``, which
        names its arguments: the request's hashes first), None without it; the router's
        ``route_kernel.RouteKernel.decide_indexed`` passes them."""
        self._lower_holders: dict[int, int] = {}
        self._workers: dict[str, _Worker] = {}
        self._by_slot: dict[int, _Worker] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._expiries: deque[tuple[float, int, tuple[int, ...]]] = deque()
        self._pending_expiries: deque[tuple[float, int, array[int]]] = deque()
        """Pending blocks by when they expire: bounded by the dispatch rate times the TTL."""
        self.events_applied = 0
        """Block-level events applied (stored or removed hashes), for metrics."""
        self.loading = 0
        """Workers flagged ``needs_resync``: their state is loading (or lost), so the index
        knows less of them than they hold and they are chosen by load meanwhile."""
        self.num_approx = 0
        """Workers in approximate mode (no batch seen): ``record_routed`` and ``expire`` have
        nothing to do without one (the predictions left are then dropped at once)."""

    # ---- membership ----
    def add_worker(self, instance_id: str, *, publishes_events: bool = True) -> int:
        """Register (or re-register, dropping its blocks) a worker; returns its slot."""
        if instance_id in self._workers:
            self.remove_worker(instance_id)
        slot = self._free_slots.pop() if self._free_slots else self._alloc_slot()
        w = _Worker(instance_id, slot, publishes_events, needs_resync=publishes_events)
        self.loading += publishes_events
        self.num_approx += 1
        self._workers[instance_id] = w
        self._by_slot[slot] = w
        return slot

    def _left_approx(self, was_approx: bool) -> None:
        """A worker left approximate mode (or went, ``was_approx``: it was in it); with the last
        one, the predictions waiting to expire go (``expire`` would skip every one of them)."""
        self.num_approx -= was_approx
        if not self.num_approx:
            self._expiries.clear()

    def _alloc_slot(self) -> int:
        self._next_slot += 1
        if self._c is not None and self._next_slot > 64 * self._cwords:
            self._cwords *= 2
            self._c.grow(self._cmap, self._cwords)
        return self._next_slot - 1

    @property
    def compiled(self) -> bool:
        """The device map is the compiled one (``native_decide`` can be used)."""
        return self._c is not None

    def remove_worker(self, instance_id: str) -> None:
        w = self._workers.pop(instance_id, None)
        if w is None:
            return
        self._left_approx(not w.events_seen)
        self.loading -= w.needs_resync
        self._clear(w)
        del self._by_slot[w.slot]
        self._free_slots.append(w.slot)

    def slot_of(self, instance_id: str) -> int:
        return self._workers[instance_id].slot

    @property
    def num_slots(self) -> int:
        """Upper bound on slot numbers (array length for per-slot vectors)."""
        return self._next_slot

    def workers(self) -> list[str]:
        return list(self._workers)

    def mode(self, instance_id: str) -> str:
        """ "events" or "approx"."""
        return "events" if self._workers[instance_id].events_seen else "approx"

    def needs_resync(self) -> list[str]:
        """Workers whose index may be wrong until they send a snapshot."""
        return [w.instance_id for w in self._workers.values() if w.needs_resync]

    def kv_seq(self, instance_id: str) -> int | None:
        """The seq of the worker's last batch applied; None where that says nothing (an unknown
        worker, no batch yet, or one that needs a snapshot)."""
        w = self._workers.get(instance_id)
        if w is None or w.needs_resync or not w.events_seen:
            return None
        return w.last_seq

    def num_blocks(self, instance_id: str | None = None) -> int:
        if instance_id is None:
            return sum(self._count(w) for w in self._workers.values())
        return self._count(self._workers[instance_id])

    def _count(self, w: _Worker) -> int:
        return int(self._c.count(self._cmap, w.slot)) if self._c is not None else len(w.blocks)

    def _device_blocks(self, w: _Worker) -> list[int]:
        return list(self._c.blocks(self._cmap, w.slot)) if self._c is not None else list(w.blocks)

    def unique_counts(self) -> dict[str, int]:
        """Per worker: blocks no other worker holds (what losing it would take away)."""
        if self._c is not None:
            per_slot = self._c.unique_counts(self._cmap, self._next_slot)
            return {wid: per_slot[w.slot] for wid, w in self._workers.items()}
        counts = dict.fromkeys(self._workers, 0)
        by_slot = self._by_slot
        for mask in self._holders.values():
            if mask & (mask - 1) == 0:
                w = by_slot.get(mask.bit_length() - 1)
                if w is not None:
                    counts[w.instance_id] += 1
        return counts

    def blocks_of(self, instance_id: str) -> frozenset[int]:
        return frozenset(self._device_blocks(self._workers[instance_id]))

    def export(self, instance_id: str) -> tuple[int, dict[str, list[int]]] | None:
        """The worker's whole state as of its last applied batch: (that seq, block hashes by
        tier), what a snapshot of it would hold; None where the index has no whole state of
        it (unknown, approximate, or waiting for a snapshot: ``kv_seq`` is None)."""
        seq = self.kv_seq(instance_id)
        if seq is None:
            return None
        w = self._workers[instance_id]
        device = self._device_blocks(w)
        if w.pending:  # the router's guesses, not the worker's state
            device = [h for h in device if h not in w.pending]
        tiers: dict[str, list[int]] = {"device": device}
        for tier, bit in _TIER_BITS.items():
            held = [h for h, bits in w.lower.items() if bits & bit]
            if held:
                tiers[tier] = held
        return seq, tiers

    # ---- events ----
    def apply(self, batch: KVEventBatch) -> ApplyResult:
        w = self._workers.get(batch.instance_id)
        if w is None:
            return ApplyResult.UNKNOWN_WORKER
        if self._c is not None:
            _check_hashes(batch, self._c.bad_hash)
        if not w.events_seen:
            # First batch: the worker publishes after all; predictions are dropped.
            w.events_seen = True
            self._left_approx(True)
            self._clear(w)
        if batch.snapshot:
            self._clear(w)
            self.loading -= w.needs_resync
            w.needs_resync = False
            w.last_seq = batch.seq
            self._apply_events(w, batch.events)
            return ApplyResult.APPLIED
        if w.last_seq is not None and batch.seq <= w.last_seq:
            return ApplyResult.DUPLICATE
        result = ApplyResult.APPLIED
        if w.last_seq is not None and batch.seq != w.last_seq + 1:
            self.loading += not w.needs_resync
            w.needs_resync = True
            result = ApplyResult.GAP
        w.last_seq = batch.seq
        self._apply_events(w, batch.events)
        return result

    def load_state(
        self, instance_id: str, seq: int, tiers: Mapping[str, Sequence[int]], step: int = STATE_STEP
    ) -> Generator[None, None, None]:
        """A worker's whole state (what a snapshot batch says: its blocks by tier, as of batch
        ``seq``) applied ``step`` blocks at a time: a generator, one slice per ``next``, so the
        caller lets requests through between slices (30,000 blocks take 4-8 ms at once). The
        worker stays flagged ``needs_resync`` (loading: known only in part) until the last
        slice; one that leaves meanwhile ends it. Hashes outside the compiled map's domain are
        refused (``TransportError``) before anything is applied (an ``array('Q')``, what a pull
        reads, holds none). Equal, once run out, to ``apply`` of the snapshot batch."""
        w = self._workers.get(instance_id)
        if w is None:
            return
        if self._c is not None:
            for hashes in tiers.values():
                if not (isinstance(hashes, array) and hashes.typecode == "Q"):  # else: by its type
                    _check_range(hashes, f"the state of {instance_id} as of batch {seq}", self._c.bad_hash)
        if not w.events_seen:
            w.events_seen = True
            self._left_approx(True)
        self._clear(w)
        self.loading += not w.needs_resync
        w.needs_resync = True
        for tier, hashes in tiers.items():
            for at in range(0, len(hashes), step):
                yield
                if self._workers.get(instance_id) is not w:
                    return
                part = hashes[at : at + step]
                if tier == "device":
                    self._store(w, part)
                else:
                    self._store_lower(w, part, _TIER_BITS.get(tier, 0))
        self.loading -= 1
        w.needs_resync = False
        w.last_seq = seq

    def _apply_events(self, w: _Worker, events: Iterable[object]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                if ev.tier == "device":
                    if w.pending:  # the worker's word now, not the router's guess
                        self._settle(w.pending, ev.block_hashes)
                    self._store(w, ev.block_hashes)
                else:
                    self._store_lower(w, ev.block_hashes, _TIER_BITS.get(ev.tier, 0))
            elif isinstance(ev, BlockRemoved):
                if ev.tier == "device":
                    if w.pending:
                        self._settle(w.pending, ev.block_hashes)
                    self._remove(w, ev.block_hashes)
                else:
                    self._remove_lower(w, ev.block_hashes, _TIER_BITS.get(ev.tier, 0))
            elif isinstance(ev, AllBlocksCleared):
                self._clear(w)

    def _store(self, w: _Worker, hashes: Sequence[int]) -> None:
        if self._c is not None:
            self._compiled(self._c.store, w, hashes)
            self.events_applied += len(hashes)
            return
        bit = 1 << w.slot
        holders = self._holders
        blocks = w.blocks
        old_of: int | None = None
        new = bit
        for h in hashes:
            old = holders.get(h, 0)
            if old is not old_of:  # else: the previous block's mask, so the same new one
                old_of, new = old, old | bit
            holders[h] = new
            blocks[h] = None
        self.events_applied += len(hashes)

    def _remove(self, w: _Worker, hashes: Sequence[int]) -> None:
        if self._c is not None:
            self._compiled(self._c.remove, w, hashes)
            self.events_applied += len(hashes)
            return
        mask = ~(1 << w.slot)
        holders = self._holders
        blocks = w.blocks
        old_of: int | None = None
        new = 0
        for h in hashes:
            if h in blocks:
                del blocks[h]
                old = holders[h]
                if old is not old_of:
                    old_of, new = old, old & mask
                if new:
                    holders[h] = new
                else:
                    del holders[h]
        self.events_applied += len(hashes)

    def _compiled(
        self, op: Callable[[object, int, Sequence[int]], None], w: _Worker, hashes: Sequence[int]
    ) -> None:
        try:
            op(self._cmap, w.slot, hashes)
        except OverflowError as exc:  # checked before any change: nothing of it applied
            raise TransportError(f"KV event from {w.instance_id}: {exc}") from None

    def _store_lower(self, w: _Worker, hashes: Sequence[int], tier_bit: int) -> None:
        if not tier_bit:
            return  # a tier this router does not know: ignored
        bit = 1 << w.slot
        holders, lower = self._lower_holders, w.lower
        for h in hashes:
            lower[h] = lower.get(h, 0) | tier_bit
            holders[h] = holders.get(h, 0) | bit
        self.events_applied += len(hashes)

    def _remove_lower(self, w: _Worker, hashes: Sequence[int], tier_bit: int) -> None:
        mask = ~(1 << w.slot)
        holders, lower = self._lower_holders, w.lower
        for h in hashes:
            bits = lower.get(h)
            if bits is None:
                continue
            bits &= ~tier_bit
            if bits:
                lower[h] = bits
                continue
            del lower[h]
            _drop(holders, h, mask)
        self.events_applied += len(hashes)

    def _clear(self, w: _Worker) -> None:
        if self._c is not None:
            self._c.clear(self._cmap, w.slot)
        else:
            self._remove(w, list(w.blocks))
        self._remove_lower(w, list(w.lower), 3)
        w.approx_expiry.clear()
        w.pending.clear()

    # ---- approximate mode ----
    def record_routed(self, instance_id: str, hashes: Sequence[int], now: float) -> None:
        """Approx workers: assume the routed request's blocks are cached until now + TTL."""
        w = self._workers.get(instance_id)
        if w is None or w.events_seen or not hashes:
            return
        expiry = now + self.approx_ttl_s
        hs = tuple(hashes)
        for h in hs:
            w.approx_expiry[h] = expiry
        self._store(w, hs)
        self._expiries.append((expiry, w.slot, hs))

    # ---- pending prefixes ----
    def record_pending(self, instance_id: str, hashes: Sequence[int], now: float) -> None:
        """A request routed to an events worker: those of its blocks the worker does not hold
        count as held there until its events store them, or ``pending_ttl_s`` from ``now``.
        Nothing for a worker whose state is loading (its snapshot would drop them) or an
        approx one (``record_routed``)."""
        w = self._workers.get(instance_id)
        if w is None or not w.events_seen or w.needs_resync or self.pending_ttl_s <= 0 or not hashes:
            return
        if self._c is not None:
            new: list[int] = self._c.store_new(self._cmap, w.slot, hashes)
        else:
            blocks = w.blocks
            new = list(dict.fromkeys(h for h in hashes if h not in blocks))
            self._store(w, new)
            self.events_applied -= len(new)  # not events
        if not new:
            return
        expiry = now + self.pending_ttl_s
        w.pending.update(dict.fromkeys(new, expiry))
        self._pending_expiries.append((expiry, w.slot, array("Q", new)))  # 8 bytes a block

    @property
    def pending_waiting(self) -> bool:
        """Some pending blocks may be due to expire (``expire_pending`` has work)."""
        return bool(self._pending_expiries)

    def expire_pending(self, now: float) -> None:
        """Take out the pending blocks whose TTL passed before the worker stored them (a
        guess is not renewed by later requests over the same blocks: they find it held)."""
        q = self._pending_expiries
        while q and q[0][0] <= now:
            _, slot, hs = q.popleft()
            w = self._by_slot.get(slot)
            if w is None or not w.pending:
                continue
            pending = w.pending
            gone = [h for h in hs if pending.get(h, _NEVER) <= now]
            for h in gone:
                del pending[h]
            if gone:
                self._remove(w, gone)
                self.events_applied -= len(gone)

    def expire(self, now: float) -> None:
        """Drop approximate predictions whose TTL has passed (entries refreshed later stay)."""
        q = self._expiries
        while q and q[0][0] <= now:
            expiry, slot, hs = q.popleft()
            w = self._by_slot.get(slot)
            if w is None or w.events_seen:
                continue
            gone = [h for h in hs if w.approx_expiry.get(h, float("inf")) <= now]
            for h in gone:
                del w.approx_expiry[h]
            self._remove(w, gone)

    def tidy(self) -> bool:
        """Move up to ``TIDY_SLOTS`` of the compiled map's old table into the new one while it
        grows (stores and removes move a few slots each; this ends a growth within seconds
        whatever their rate, and frees the old table). True while a growth is under way."""
        return self._c is not None and bool(self._c.migrate(self._cmap, TIDY_SLOTS))

    # ---- lookup ----
    def overlap_masks(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        """Runs ``(mask, n)``: the workers in ``mask`` hold the first blocks for ``n`` more
        positions. Masks are nested (each a subset of the previous)."""
        if self._c is not None:
            runs: list[tuple[int, int]] = self._c.runs(self._cmap, hashes)
            return runs
        get = self._holders.get
        runs = []
        cur = -1
        n = 0
        last: object = _NONE
        for h in hashes:
            held = get(h)
            if held is last:  # same mask object as the previous block: same AND
                n += 1
                continue
            if held is None:
                break
            last = held
            m = held & cur
            if m != cur:
                if n:
                    runs.append((cur, n))
                if not m:
                    return runs
                cur, n = m, 0
            n += 1
        if n:
            runs.append((cur, n))
        return runs

    def overlaps(self, hashes: Sequence[int], num_slots: int | None = None) -> np.ndarray:
        """Per slot: number of leading blocks of ``hashes`` that slot holds (int32 vector)."""
        size = self._next_slot if num_slots is None else num_slots
        out = np.empty(size, dtype=np.int32)
        runs = self.overlap_masks(hashes)
        fill_by_depth(out, runs, list(itertools.accumulate((n for _, n in runs), initial=0)))
        return out

    def lower_overlaps(self, hashes: Sequence[int], num_slots: int | None = None) -> np.ndarray:
        """Per slot: blocks of ``hashes`` right after that slot's device-pool prefix that it
        holds in a lower tier (the engine loads those instead of computing them)."""
        size = self._next_slot if num_slots is None else num_slots
        out = np.zeros(size, dtype=np.int32)
        if not self._lower_holders:
            return out
        lower = self._lower_holders
        device = self._device_mask
        dev = -1  # workers still in their device prefix (all, at the start)
        low = 0  # workers past it, still finding blocks below
        runs: list[tuple[int, int]] = []
        for h in hashes:
            dm, lm = device(h), lower.get(h, 0)
            low = (low | (dev & ~dm)) & lm
            dev &= dm
            if low:
                if runs and runs[-1][0] == low:
                    runs[-1] = (low, runs[-1][1] + 1)
                else:
                    runs.append((low, 1))
            elif not dev:
                break
        _add_runs(out, runs)
        return out

    def _device_mask(self, h: int) -> int:
        if self._c is not None:
            mask: int = self._c.mask(self._cmap, h)
            return mask
        return self._holders.get(h, 0)

    def has_lower_tiers(self) -> bool:
        return bool(self._lower_holders)

    def overlap_by_worker(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker id: leading blocks held (only workers with at least one)."""
        ov = self.overlaps(hashes)
        return {w.instance_id: int(ov[w.slot]) for w in self._workers.values() if ov[w.slot]}

    # ---- checks ----
    def check_integrity(self) -> None:
        seen: dict[int, int] = {}
        seen_lower: dict[int, int] = {}
        for w in self._workers.values():
            bit = 1 << w.slot
            for h in self._device_blocks(w):
                seen[h] = seen.get(h, 0) | bit
            for h, tiers in w.lower.items():
                assert tiers, w.instance_id
                seen_lower[h] = seen_lower.get(h, 0) | bit
            assert not (w.events_seen and w.approx_expiry), w.instance_id
            assert w.events_seen or not w.pending, w.instance_id
            assert all(h in seen and seen[h] & bit for h in w.pending), "a pending block not held"
        assert self.loading == sum(w.needs_resync for w in self._workers.values())
        if self._c is not None:
            broken = self._c.check(self._cmap)
            assert broken is None, broken
            assert not self._holders, "the dict holds blocks while the compiled map is the map"
            assert seen == self._c.items(self._cmap), "holders out of step with per-worker block sets"
        else:
            assert seen == self._holders, "holders out of step with per-worker block sets"
        assert seen_lower == self._lower_holders, "lower holders out of step with per-worker sets"
        assert self.num_approx == sum(not w.events_seen for w in self._workers.values())


_NONE = object()
_NEVER = float("inf")
_HASH_LIMIT = 1 << 64


def _settle(pending: dict[int, float], hashes: Sequence[int]) -> None:
    """The worker's events named these blocks: none of them is a guess any longer (the
    compiled module's ``settle`` is the same loop)."""
    pop = pending.pop
    for h in hashes:
        pop(h, None)


def _bad_hash(hashes: Sequence[int]) -> int | None:
    """The first of ``hashes`` outside the compiled map's domain (a 64-bit unsigned int), or
    None: the reference for the compiled module's ``bad_hash`` (the check runs only with the
    compiled map; the dict takes any int), tested equal."""
    if hashes and (min(hashes) < 0 or max(hashes) >= _HASH_LIMIT):
        return next(h for h in hashes if not 0 <= h < _HASH_LIMIT)
    return None


def _check_hashes(batch: KVEventBatch, bad_hash: Callable[[Sequence[int]], object]) -> None:
    """The compiled map's domain: every hash of the batch a 64-bit unsigned int."""
    for ev in batch.events:
        _check_range(
            getattr(ev, "block_hashes", ()), f"KV event batch {batch.seq} from {batch.instance_id}", bad_hash
        )


def _check_range(hashes: Sequence[int], what: str, bad_hash: Callable[[Sequence[int]], object]) -> None:
    if (bad := bad_hash(hashes)) is not None:
        raise TransportError(f"{what}: block hash {bad} is not a 64-bit unsigned int")


def dropouts(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(mask, overlap)`` from ``overlap_masks`` runs: the workers in ``mask`` hold exactly
    ``overlap`` leading blocks. The masks are disjoint; workers in none of them hold none."""
    out = []
    total = 0
    for i, (mask, n) in enumerate(runs):
        total += n
        if i + 1 < len(runs):
            mask &= ~runs[i + 1][0]
        out.append((mask, total))
    return out


def overlap_of(runs: Sequence[tuple[int, int]], slot: int) -> int:
    """One slot's overlap (leading blocks held) from ``overlap_masks`` runs."""
    total = 0
    for mask, n in runs:
        if not mask >> slot & 1:
            break
        total += n
    return total


_FEW_BITS = 8
"""Up to this many workers in the runs are set one index at a time; more, through bit vectors."""


def fill_by_depth(out: np.ndarray, runs: Sequence[tuple[int, int]], table: Sequence[float]) -> None:
    """``out[slot] = table[d]`` where ``d`` is how many of the nested ``overlap_masks`` runs
    hold the slot (``table`` has ``len(runs) + 1`` entries; slots < len(out)). Few workers in
    the runs are set one index at a time; many, by unpacking all the masks in one pass and
    counting, per slot, the masks that hold it."""
    out.fill(table[0])
    if not runs:
        return
    if runs[0][0].bit_count() <= _FEW_BITS:  # the runs are nested: the first is the largest
        for depth, (mask, _) in enumerate(dropouts(runs), start=1):
            value = table[depth]
            while mask:
                low = mask & -mask
                out[low.bit_length() - 1] = value
                mask ^= low
        return
    size = len(out)
    nbytes = (size + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m, _ in runs), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little").reshape(len(runs), nbytes * 8)[:, :size]
    depth = bits[0] if len(runs) == 1 else bits.sum(axis=0, dtype=np.uint8)
    np.take(np.asarray(table, dtype=out.dtype), depth, out=out)


def _drop(holders: dict[int, int], h: int, mask: int) -> None:
    """Clear a worker's bit (``mask`` has every other bit) from ``holders[h]``."""
    m = holders[h] & mask
    if m:
        holders[h] = m
    else:
        del holders[h]


def _add_runs(out: np.ndarray, runs: Iterable[tuple[int, int]]) -> None:
    """Add ``n`` to every slot whose bit is set in ``mask``, for each run ``(mask, n)``."""
    size = len(out)
    nbytes = (size + 7) // 8
    for mask, n in runs:
        bits = np.unpackbits(
            np.frombuffer(mask.to_bytes(nbytes, "little"), dtype=np.uint8), bitorder="little"
        )[:size]
        out += bits.astype(np.int32) * n
