"""A router service's pulls of its workers' KV state (``protocol/kv_sync.py``): the gap in a
worker's event stream replayed from its ring, or its whole cache, a few workers at a time.

Each worker's live batches (the event plane, ``offer``) are applied in seq order. A batch that
skips ahead (the router missed some: a NATS reconnect, a dropped message) starts a pull of the
gap; a worker that joins, or comes back after an outage, is pulled too (``pull``). While a
worker's pull runs, its live batches are held (up to ``MAX_HELD``) and applied after it, the
ones the pull covered dropped as duplicates by the index. At most ``max_pulls`` pulls run at
once, each bounded in time; a failed one is retried with backoff (``tick``), the worker routed
meanwhile by what the index has (nothing, for one that just joined: by load alone).

A whole state is asked of another router replica first where one is known (``peers``, the
replicas' ``kv_replica`` addresses; ``router/kv_replica.py``): a frontend that joins while
another runs copies that one's index and asks the workers only for the gaps since. A replica
that answers ``missing``, fails or is slow leaves it to the worker.

A worker without a ``kv_sync_address`` (an older one) is asked the old way: its whole cache
published on the event plane (``fallback``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from interlock.errors import TransportError
from interlock.protocol import KVEventBatch
from interlock.protocol.kv_sync import (
    KvReplicaRequest,
    KvSnapshotPart,
    KvSyncHeader,
    KvSyncRequest,
    unpack_hashes,
)
from interlock.router.indexer import ApplyResult
from interlock.runtime.interfaces import RequestPlane

log = logging.getLogger(__name__)

MAX_PULLS = 4
"""Pulls at once (a joining frontend's many workers queue for these)."""
PULL_TIMEOUT_S = 30.0
MAX_HELD = 4096
"""Live batches held per worker while its pull runs; past it they are dropped, and the gap they
leave is pulled next."""
RETRY_S = (1.0, 30.0)
"""A failed pull's first retry, and the longest (doubling)."""
REPLICA_TIMEOUT_S = 5.0
"""A replica's answer for one worker (a few hundred KB at most): past it, the worker is asked."""
MAX_REPLICA_TRIES = 2
"""Replicas asked for one worker's state before the worker is."""

_encode = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(KvSyncHeader).decode
_decode_part = msgspec.msgpack.Decoder(KvSnapshotPart).decode
_decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode


class KvIndexTarget(Protocol):
    """What a pull reads and feeds of a model's router (``model_router.Router``)."""

    def apply_events(self, batch: KVEventBatch) -> ApplyResult: ...

    def kv_seq(self, instance_id: str) -> int | None:
        """The seq of the worker's last batch applied; None where a snapshot is needed."""
        ...

    def needs_resync(self) -> list[str]: ...

    def load_state(
        self, instance_id: str, seq: int, tiers: Mapping[str, Sequence[int]]
    ) -> Generator[None, None, None]:
        """A worker's whole state, applied a slice per ``next`` (the worker stays loading until
        the last)."""
        ...


@dataclass(slots=True)
class KvSyncStats:
    replays: int = 0
    snapshots: int = 0
    failed: int = 0
    replayed_batches: int = 0
    snapshot_blocks: int = 0
    bytes: int = 0
    """Bytes pulled from workers, every frame."""
    replicas: int = 0
    """Whole states copied from another router replica instead of the worker."""
    replica_misses: int = 0
    """Asks of a replica that it could not answer (``missing``, failed, slow)."""
    replica_bytes: int = 0


class KvSync:
    def __init__(
        self,
        requests: RequestPlane,
        fallback: Callable[[str], None],
        *,
        max_pulls: int = MAX_PULLS,
        timeout_s: float = PULL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        peers: Callable[[str], list[str]] = lambda wid: [],
    ) -> None:
        self._requests = requests
        self._fallback = fallback
        self._peers = peers
        """The ``kv_replica`` addresses to ask for a worker's whole state, in order."""
        self._sem = asyncio.Semaphore(max_pulls)
        self._applier = StateApplier()
        self._timeout_s = timeout_s
        self._clock = clock
        self._held: dict[str, list[KVEventBatch]] = {}
        """Workers being pulled: their live batches since the pull started."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._retry: dict[str, tuple[float, float]] = {}
        """Workers whose last pull failed: (when to try again, the delay after that)."""
        self.stats = KvSyncStats()

    @property
    def syncing(self) -> int:
        """Workers whose pull is queued or running."""
        return len(self._held)

    def offer(self, router: KvIndexTarget, address: str | None, batch: KVEventBatch) -> None:
        """A live batch from the event plane: held while its worker's pull runs, the start of a
        pull where it skips ahead, else applied."""
        wid = batch.instance_id
        held = self._held.get(wid)
        if held is not None:
            if len(held) < MAX_HELD:
                held.append(batch)
            return
        if address is not None and not batch.snapshot and wid not in self._retry:
            last = router.kv_seq(wid)
            if last is not None and batch.seq > last + 1:
                self.pull(router, wid, address, since=last, held=[batch])
                return
        if router.apply_events(batch) is ApplyResult.GAP and address is None:
            self._fallback(wid)

    def pull(
        self,
        router: KvIndexTarget,
        wid: str,
        address: str | None,
        *,
        since: int | None = None,
        held: list[KVEventBatch] | None = None,
    ) -> None:
        """Pull ``wid``'s batches after ``since`` (None: its whole cache) unless a pull runs."""
        if address is None:
            self._fallback(wid)
            return
        if wid in self._held:
            return
        self._held[wid] = held or []
        self._tasks[wid] = asyncio.ensure_future(self._pull(router, wid, address, since))

    def forget(self, wid: str) -> None:
        """The worker left: its pull (if any) ends, nothing of it is applied."""
        task = self._tasks.pop(wid, None)
        self._held.pop(wid, None)
        self._retry.pop(wid, None)
        if task is not None:
            task.cancel()

    def tick(self, router: KvIndexTarget, address_of: Callable[[str], str | None]) -> None:
        """Pull the workers the index says need a snapshot, once their retry time has come."""
        now = self._clock()
        for wid in router.needs_resync():
            retry = self._retry.get(wid)
            if wid in self._held or (retry is not None and now < retry[0]):
                continue
            self.pull(router, wid, address_of(wid))

    async def close(self) -> None:
        self._applier.close()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _pull(self, router: KvIndexTarget, wid: str, address: str, since: int | None) -> None:
        ok = False
        try:
            async with self._sem:
                await asyncio.wait_for(self._fetch(router, wid, address, since), self._timeout_s)
            ok = True
            self._retry.pop(wid, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried with backoff; meanwhile the index as it is
            self.stats.failed += 1
            delay = self._retry.get(wid, (0.0, RETRY_S[0]))[1]
            self._retry[wid] = (self._clock() + delay, min(delay * 2, RETRY_S[1]))
            log.warning("KV pull from worker %s failed (%s): retrying in %.0fs", wid, exc, delay)
        finally:
            if self._tasks.get(wid) is asyncio.current_task():
                del self._tasks[wid]
        for batch in self._held.pop(wid, []):  # in order; a gap among them pulls again
            if ok:
                self.offer(router, address, batch)
            else:  # applied as they are: a gap leaves the worker to ``tick``'s retry
                router.apply_events(batch)

    async def _fetch(self, router: KvIndexTarget, wid: str, address: str, since: int | None) -> None:
        if since is None:
            for peer in self._peers(wid)[:MAX_REPLICA_TRIES]:
                if await self._from_replica(router, wid, peer):
                    return
        stream = self._requests.stream(address, _encode(KvSyncRequest(since=since)))
        async with contextlib.aclosing(stream):
            frames = aiter(stream)
            first = await anext(frames)
            header = _decode_header(first)
            self.stats.bytes += len(first)
            if header.kind == "replay":
                for _ in range(header.frames):
                    frame = await anext(frames)
                    self.stats.bytes += len(frame)
                    router.apply_events(_decode_batch(frame))
                self.stats.replays += 1
                self.stats.replayed_batches += header.frames
                return
            if header.kind != "snapshot":
                raise TransportError(f"worker {wid} answered a KV pull with {header.kind!r}")
            by_tier, nbytes = await _read_parts(frames, header.frames)
            self.stats.bytes += nbytes
        await self._applier.apply(router.load_state(wid, header.seq, by_tier))
        self.stats.snapshots += 1
        self.stats.snapshot_blocks += sum(len(h) for h in by_tier.values())

    async def _from_replica(self, router: KvIndexTarget, wid: str, peer: str) -> bool:
        """Copy ``wid``'s whole state from the replica at ``peer``; False where it could not."""
        stream = self._requests.stream(peer, _encode(KvReplicaRequest(instance_id=wid)))
        try:
            async with contextlib.aclosing(stream), asyncio.timeout(REPLICA_TIMEOUT_S):
                frames = aiter(stream)
                first = await anext(frames)
                header = _decode_header(first)
                if header.kind != "snapshot":
                    self.stats.replica_misses += 1
                    return False
                by_tier, nbytes = await _read_parts(frames, header.frames)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker is asked instead
            self.stats.replica_misses += 1
            log.info("KV state of %s from replica %s failed (%s): asking the worker", wid, peer, exc)
            return False
        self.stats.replica_bytes += len(first) + nbytes
        await self._applier.apply(router.load_state(wid, header.seq, by_tier))
        self.stats.replicas += 1
        self.stats.snapshot_blocks += sum(len(h) for h in by_tier.values())
        return True


async def _read_parts(frames: AsyncIterator[bytes], count: int) -> tuple[dict[str, array[int]], int]:
    """A snapshot's ``count`` parts: block hashes by tier (arrays, no Python int made), and
    the bytes they took."""
    by_tier: dict[str, array[int]] = {}
    nbytes = 0
    for _ in range(count):
        frame = await anext(frames)
        nbytes += len(frame)
        part = _decode_part(frame)
        try:
            by_tier[part.tier] = unpack_hashes(part.hashes, by_tier.get(part.tier))
        except ValueError as exc:
            raise TransportError(f"a KV state part: {exc}") from None
    return by_tier, nbytes


class StateApplier:
    """Pulled states applied one slice per turn of the event loop, whatever the pulls running.

    Each pull that ran its own slices put one slice per pull into every turn: a request's each
    step (its body read, routing, the worker's reply, the response) waited behind all of them.
    Here one task applies the states in the order they came, a slice a turn, so a step waits
    behind one slice (``STATE_STEP`` blocks, about 1 ms); the pulls' reading goes on meanwhile.
    """

    def __init__(self) -> None:
        self._queue: deque[tuple[Generator[None, None, None], asyncio.Future[None]]] = deque()
        self._task: asyncio.Task[None] | None = None

    async def apply(self, slices: Generator[None, None, None]) -> None:
        """Run ``slices`` (a ``load_state``) to its end, a slice per turn; its error is raised
        here. Cancelled: the rest of it is not applied."""
        done = asyncio.get_running_loop().create_future()
        self._queue.append((slices, done))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        await done

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for slices, done in self._queue:
            slices.close()
            done.cancel()
        self._queue.clear()

    async def _run(self) -> None:
        queue = self._queue
        while queue:
            slices, done = queue[0]
            if done.done():  # its pull was cancelled
                queue.popleft()
                slices.close()
                continue
            try:
                ended = next(slices, _END) is _END
            except Exception as exc:  # noqa: BLE001 - the pull's error, raised where it waits
                queue.popleft()
                done.set_exception(exc)
                continue
            if ended:
                queue.popleft()
                done.set_result(None)
            await asyncio.sleep(0)


_END = object()
