"""The KV memory hierarchy below the device pool: offload on eviction, onboard on a prefix hit.

Idea (victim caches, as SGLang's HiCache write-back mode and LMCache's CPU offloading): the
device pool, host memory and disk form one LRU cache whose levels hold *different* blocks
where they can. A block the device pool evicts is copied to the host tier before its device
block is reused (``offload``, called by the engine core right after ``schedule`` and before
anything writes into the freshly allocated blocks); a block the host tier evicts goes to disk.
Copying on eviction rather than on every computed block (write-through) keeps the total
capacity the sum of the tiers and copies only what leaves; the offload copy is a memory copy
on the engine thread (device to host), the disk write is I/O and runs on the tier I/O thread.

A prefix lookup that finds the next blocks of a request below the device pool
(``lookup``, after the device-pool hits) makes the scheduler allocate fresh device blocks and
park the request, holding no batch slot, as for KV from another worker. ``start_load`` then
queues one job on the I/O thread that copies the blocks in (host: from a pinned slot; disk:
read, check, copy); the step loop never waits for it. ``poll`` (once per step) hands back the
finished loads: how many leading blocks arrived intact. The rest are computed as usual.

Deadlines (``deadline``): a load not done in time is handed back with the blocks that arrived
by then, and its request computes the rest; the job, whenever it ends, copies nothing more
(``CopyGuard``). All copies share one I/O thread, in order, so a job past its load's deadline
is taken for a stuck thread (a hung disk): until it ends, lookups find nothing below the pool
(a new load would only queue behind it, and wait out its own deadline) and no block is queued
for the disk (each write would hold a block's bytes in memory behind it, and the disk is the
suspect). The host tier keeps taking evicted blocks (a copy on the engine thread). When the
job ends, everything works as before.

A host tier shared by the workers of a host is written through instead (``write_through``):
every block the pool hashes is copied up right after the step that computed it, so another
worker can load a prefix this one still holds on its device. Measured on the Mooncake
conversation trace with 8 workers sharing one host tier as large as their pools: 98% of the
hit ratio of one LRU of the same total size written through, 91% on eviction (the router
cannot always place a request where its prefix is; the shared tier heals that only if it has
the prefix). A private tier stays a victim cache (its capacity adds to the pool's).

Events: the manager records ``BlockStored``/``BlockRemoved`` with ``tier="host"`` or
``"disk"``; the owner drains them with the pool's events. A tier event carries the block's
parent hash when it is known then (a block stored from the pool), else None: the tiers keep
no per-block metadata (a shared tier could not keep it consistent), and the router needs only
the hashes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from interlock.engine.block_pool import Evicted
from interlock.engine.scheduler import LoadOrder
from interlock.engine.tiers.deadline import Abandoned, CopyGuard, LoadDeadline
from interlock.engine.tiers.disk import HEADER_BYTES, DiskTier, read_block
from interlock.engine.tiers.host import HostStore
from interlock.engine.tiers.io import Job, TierIO
from interlock.protocol import BlockRemoved, BlockStored, KVEvent, TierStats

log = logging.getLogger(__name__)

_EMA = 0.2


class BlockCopier(Protocol):
    """The runner's side of a copy (``interlock.engine.runner.ModelRunner`` has it)."""

    kv_block_nbytes: int

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None: ...

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None: ...

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None: ...


@dataclass(frozen=True, slots=True)
class LoadDone:
    request_id: str
    num_loaded: int
    """Leading blocks of the order now in their device blocks."""


@dataclass(slots=True)
class _Counters:
    """The mutable side of ``TierStats``' counters (same names)."""

    hits: int = 0
    loads: int = 0
    load_failures: int = 0
    load_s: float = 0.0
    load_s_per_block: float = 0.0
    stores: int = 0
    evictions: int = 0
    load_timeouts: int = 0


@dataclass(slots=True)
class _Load:
    request_id: str
    job: Job[tuple[int, list[float]]] | None
    handles: list[Any]
    """The host tier's read handles (released when the job ends)."""
    disk_pins: list[int]
    tiers: list[str]
    """Source tier of each block, in order."""
    deadline: float = float("inf")
    """Clock time by which the job should have ended (``_queue``)."""
    guard: CopyGuard = field(default_factory=CopyGuard)
    handed_back: int | None = None
    """Abandoned: the leading blocks handed back then (its job has not ended yet)."""


@dataclass(slots=True)
class _Source:
    block_id: int
    handle: Any | None = None
    disk: tuple[Path, int, bytes, int] | None = None


@dataclass(slots=True)
class KVTiers:
    runner: BlockCopier
    io: TierIO
    host: HostStore | None = None
    disk: DiskTier | None = None
    deadline: LoadDeadline | None = None
    """None: a load is waited for however long it takes."""
    clock: Callable[[], float] = time.monotonic
    """The engine's clock (seconds), for the deadlines."""
    _loads: list[_Load] = field(default_factory=list)
    _events: list[KVEvent] = field(default_factory=list)
    _counters: dict[str, _Counters] = field(default_factory=dict)
    _scratch: bytearray = field(default_factory=bytearray)
    """The buffer disk reads land in, reused (I/O thread only; its jobs run one at a time)."""

    def __post_init__(self) -> None:
        if self.host is None and self.disk is None:
            raise ValueError("KVTiers needs a host or a disk tier")
        for t in self.tiers:
            self._counters[t.name] = _Counters()

    @property
    def tiers(self) -> list[HostStore | DiskTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    # ---- lookup ----
    def lookup(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` some tier here holds (readable now)."""
        if self._stuck():
            return 0
        host, disk = self.host, self.disk
        n = 0
        for h in hashes:
            if (host is None or h not in host) and (disk is None or h not in disk):
                break
            n += 1
        return n

    # ---- offload ----
    def offload(self, evicted: Sequence[Evicted]) -> None:
        """Copy blocks the device pool just evicted one tier down (engine thread, before the
        blocks are written again)."""
        host = self.host
        disk = None if self._stuck() else self.disk  # (see the module note on deadlines)
        for ev in evicted:
            h = ev.block_hash
            if host is not None:
                if h in host:
                    host.touch(h)
                    continue
                stored, spilled = host.store(
                    h, partial(_export, self.runner, ev.block_id), keep_evicted=disk is not None
                )
                if stored:
                    self._stored(host.name, h, ev.parent_hash)
                for victim, data in spilled:
                    self._removed(host.name, victim)
                    if disk is not None and data is not None:
                        self._to_disk(victim, data)
            elif disk is not None and h not in disk:
                buf = bytearray(self.runner.kv_block_nbytes)
                self.runner.export_blocks([ev.block_id], memoryview(buf))
                self._to_disk(h, bytes(buf))

    def write_through(self, stored: Sequence[Evicted]) -> None:
        """Copy blocks the pool just hashed (their KV computed in this step) to the host tier
        (engine thread, after the step: the blocks are not written again before the next one)."""
        self.offload(stored)

    def _to_disk(self, block_hash: int, data: bytes) -> None:
        disk = self.disk
        assert disk is not None
        if block_hash in disk:
            disk.touch(block_hash)
            return
        _started, evicted = disk.put(block_hash, data)
        for victim in evicted:
            self._removed(disk.name, victim)

    # ---- onboard ----
    def move(self, evicted: Sequence[Evicted], orders: Sequence[LoadOrder]) -> None:
        """One step's copies: pin the sources of the new loads, copy the evicted blocks down,
        then queue the loads. In this order a load never loses its source to this step's
        offload, and never writes a device block before its old KV was copied out."""
        plans = [self._plan(order) for order in orders]
        if evicted:
            self.offload(evicted)
        for load, sources in plans:
            self._queue(load, sources)

    def start_load(self, order: LoadOrder) -> int:
        """Queue one load alone (``move`` with nothing evicted); returns blocks queued."""
        load, sources = self._plan(order)
        self._queue(load, sources)
        return len(sources)

    def _queue(self, load: _Load, sources: list[_Source]) -> None:
        """Submit the copy. Its deadline counts from those of the loads queued before it: the
        jobs run one at a time, in order."""
        if self.deadline is not None:
            now = self.clock()
            after = max((x.deadline for x in self._loads if x.handed_back is None), default=now)
            nbytes = len(sources) * self.runner.kv_block_nbytes
            load.deadline = max(now, after) + self.deadline.seconds(nbytes)
        load.job = self.io.submit(partial(self._copy_in, sources, load.guard))
        self._loads.append(load)

    def _plan(self, order: LoadOrder) -> tuple[_Load, list[_Source]]:
        """Sources of the leading blocks of ``order`` found here (host slots pinned)."""
        sources: list[_Source] = []
        tiers: list[str] = []
        host, disk = self.host, self.disk
        for b, h in zip(order.block_ids, order.block_hashes, strict=True):
            if host is not None and h in host:
                handle = host.acquire(h)
                assert handle is not None
                sources.append(_Source(b, handle=handle))
                tiers.append(host.name)
            elif disk is not None and h in disk:
                sources.append(_Source(b, disk=disk.acquire(h)))
                tiers.append(disk.name)
            else:
                break
        for t in tiers:
            self._counters[t].hits += 1
        handles = [s.handle for s in sources if s.handle is not None]
        disk_pins = [h for h, t in zip(order.block_hashes, tiers, strict=False) if t == "disk"]
        return _Load(order.request_id, None, handles, disk_pins, tiers), sources

    def _copy_in(self, sources: list[_Source], guard: CopyGuard) -> tuple[int, list[float]]:
        """I/O thread: copy in order; stops at the first block that cannot be read intact, or
        when the load is abandoned (every copy into device blocks runs inside ``guard``).

        Consecutive host blocks go in one copy call (``read_many`` + ``import_each``): per
        block, the Python around a call cost about half of a SmolLM2 block's copy. A disk
        block is read (one read of the whole file, checksum) into a reused buffer, then copied
        in: measured on 2 busy cores, reading the next block on a helper thread meanwhile was
        slower (2.1 against 3.1 GB/s): the thread hand-off per block waits for a core."""
        host, runner = self.host, self.runner
        times: list[float] = []
        i = 0
        try:
            while i < len(sources):
                t0 = time.perf_counter()
                if sources[i].handle is not None:
                    assert host is not None
                    j = i
                    while j < len(sources) and sources[j].handle is not None:
                        j += 1
                    group = sources[i:j]
                    ids = [s.block_id for s in group]
                    sink = partial(_import_each, runner, ids, guard)
                    n = host.read_many([s.handle for s in group], sink)
                    per_block = (time.perf_counter() - t0) / max(1, len(group))
                    times.extend([per_block] * n)
                    guard.arrived(len(times))
                    if n < len(group):
                        break
                    i = j
                    continue
                s = sources[i]
                assert s.disk is not None
                if not self._scratch:
                    self._scratch = bytearray(HEADER_BYTES + runner.kv_block_nbytes + 1)
                data = read_block(*s.disk, self._scratch)
                if data is None:
                    break
                with guard.copying():
                    runner.import_blocks([s.block_id], data)
                times.append(time.perf_counter() - t0)
                guard.arrived(len(times))
                i += 1
        except Abandoned:
            pass  # the request went on without the rest: nothing more is copied
        return len(times), times

    def poll(self) -> list[LoadDone]:
        """Engine thread, once per step: finished disk writes become findable; finished loads,
        and loads past their deadline, are handed back."""
        if self.disk is not None:
            ready, _failed = self.disk.poll()
            for h in ready:
                self._stored(self.disk.name, h, None)
        now = self.clock()
        done: list[LoadDone] = []
        still: list[_Load] = []
        stuck = False
        for load in self._loads:  # in the order their jobs run
            job = load.job
            assert job is not None
            if job.done:
                self._finish(load, job, done)
                continue
            if load.handed_back is None and (stuck or now >= load.deadline):
                self._abandon(load, done)  # behind a stuck job: it would not come either
            stuck = stuck or load.handed_back is not None
            still.append(load)
        self._loads = still
        return done

    def _finish(self, load: _Load, job: Job[tuple[int, list[float]]], done: list[LoadDone]) -> None:
        """The job ended: its pins go; its request goes on unless it did at the deadline."""
        if self.host is not None:
            for handle in load.handles:
                self.host.release(handle)
        if self.disk is not None:
            for h in load.disk_pins:
                self.disk.release(h)
        n, times = job.result if job.result is not None else (0, [])
        if job.error is not None:
            log.warning("loading KV for %s failed: %s", load.request_id, job.error)
        if load.handed_back is not None:
            n = load.handed_back
            times = times[:n]
        else:
            for tier in load.tiers[n : n + 1]:
                self._counters[tier].load_failures += 1
            done.append(LoadDone(load.request_id, n))
        for tier, t in zip(load.tiers, times, strict=False):
            c = self._counters[tier]
            c.loads += 1
            c.load_s += t
            c.load_s_per_block = t if not c.load_s_per_block else (1 - _EMA) * c.load_s_per_block + _EMA * t

    def _abandon(self, load: _Load, done: list[LoadDone]) -> None:
        """Past the deadline: hand the request back with the blocks that arrived, unless a
        copy runs right now (then at the next poll). The pins stay until the job ends."""
        n = load.guard.abandon()
        if n is None:
            return
        load.handed_back = n
        for tier in load.tiers[n:]:
            self._counters[tier].load_timeouts += 1
        log.warning(
            "loading KV for %s abandoned, tier I/O stuck past a load's deadline: %d of %d "
            "blocks arrived, computing the rest (no loads or disk writes until it ends)",
            load.request_id,
            n,
            len(load.tiers),
        )
        done.append(LoadDone(load.request_id, n))

    def _stuck(self) -> bool:
        """A load's job ran past its deadline and has not ended (see the module note)."""
        return any(load.handed_back is not None for load in self._loads)

    def has_pending(self) -> bool:
        """A step could hand something back: a load not yet done or abandoned, a disk write
        (not while the I/O thread is stuck: its end wakes the engine anyway)."""
        if any(load.handed_back is None for load in self._loads):
            return True
        return not self._stuck() and self.disk is not None and self.disk.num_writing > 0

    # ---- events, figures, maintenance ----
    def _stored(self, tier: str, block_hash: int, parent: int | None) -> None:
        self._counters[tier].stores += 1
        self._events.append(BlockStored(block_hashes=(block_hash,), parent_block_hash=parent, tier=tier))

    def _removed(self, tier: str, block_hash: int) -> None:
        self._counters[tier].evictions += 1
        self._events.append(BlockRemoved(block_hashes=(block_hash,), tier=tier))

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def snapshot(self) -> list[KVEvent]:
        """``BlockStored`` for every block held here (after the pool's snapshot)."""
        return [
            BlockStored(block_hashes=(h,), parent_block_hash=None, tier=t.name)
            for t in self.tiers
            for h in t.hashes()
        ]

    def hashes_by_tier(self) -> dict[str, list[int]]:
        """The blocks of ``snapshot`` as hashes, by tier (tiers holding none left out)."""
        return {t.name: hashes for t in self.tiers if (hashes := t.hashes())}

    def clear(self) -> None:
        """Forget every block (the pool's ``AllBlocksCleared`` covers every tier)."""
        for t in self.tiers:
            t.clear()

    def stats(self) -> tuple[TierStats, ...]:
        out = []
        for t in self.tiers:
            counters = asdict(self._counters[t.name])
            failures = t.write_failures if isinstance(t, DiskTier) else 0
            out.append(
                TierStats(
                    tier=t.name, blocks=len(t), capacity=t.capacity, write_failures=failures, **counters
                )
            )
        return tuple(out)

    def check_integrity(self) -> None:
        for t in self.tiers:
            t.check_integrity()
        if self.host is not None:
            pinned = sum(len(load.handles) for load in self._loads)
            if pinned < self.host.num_pinned:
                raise AssertionError("kv tiers: host slots pinned by no load")
        if self.disk is not None:
            if sum(len(load.disk_pins) for load in self._loads) != self.disk.num_pinned:
                raise AssertionError("kv tiers: disk pins out of step with the loads")

    def close(self) -> None:
        """Finish queued I/O and release the tiers. A stuck I/O thread is not waited for (a
        slow one for the deadline's floor at most): nothing more is copied into device blocks,
        and the tiers stay open (queued jobs may still touch them) until the process exits,
        which also drops the disk directory's lock."""
        if self._stuck():
            timeout: float | None = 0.0
        else:
            timeout = self.deadline.floor_s if self.deadline is not None else None
        if not self.io.close(timeout):
            for load in self._loads:
                load.guard.abandon()
            log.warning("KV tier I/O is stuck: shutting down without waiting for it")
            return
        if self.host is not None:
            self.host.close()
        if self.disk is not None:
            self.disk.poll()
            self.disk.close()


def _export(runner: BlockCopier, block_id: int, out: memoryview) -> None:
    runner.export_blocks([block_id], out)


def _import_each(
    runner: BlockCopier, block_ids: list[int], guard: CopyGuard, views: list[memoryview]
) -> None:
    """The leading ``len(views)`` blocks (a shared tier may hand fewer than asked)."""
    with guard.copying():
        runner.import_each(block_ids[: len(views)], views)
