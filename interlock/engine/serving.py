"""The engine seam: what a worker serves, whichever engine runs behind it.

A ``Worker`` (``engine.worker``) puts one ``ServingEngine`` on the planes. Interlock's own engine
(``AsyncEngine`` over an ``EngineCore``), vLLM's (``engine.vllm.VllmEngine``) and the fake below
sit behind it; nothing above the worker knows which one runs beyond what the worker announces
(its ``InstanceInfo``: block size, KV blocks, context length, and ``metadata["engine"]``).

The contract, for every implementation:
- ``generate(req)`` streams ``GenerateOutput`` chunks (new tokens only) for one request until a
  finished one; closing the stream early aborts the request. A request refused by the engine
  ends with one output whose ``finish_reason`` is ``"error"``, never with an exception.
- ``resume_token_ids`` (migration) are continued after, as if generated here: counted against
  ``max_tokens``, never streamed again.
- after ``start(sink)`` the engine hands its KV events (``interlock.protocol.events``, block
  hashes from ``interlock.kvhash``) and load reports to ``sink``, on the loop that started it.
- ``kv_snapshot()`` lists the whole cache as events (a router's re-sync): ``AllBlocksCleared``,
  then the blocks, each after its parent; ``kv_state()`` the same blocks as hashes by tier, with
  no parents or tokens (a router's pull, ``engine/kv_sync.py``: 0.4 ms where the events take 51
  at 30,000 blocks, on the engine's step thread; ``benchmarks/index_costs.py``).
- ``problem()`` is None while the engine can serve; otherwise why not (a dead engine process):
  the worker then leaves discovery and exits, so a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

from interlock.kvchain import hash_blocks
from interlock.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    GenerateOutput,
    GenerateRequest,
    KVEvent,
    LoadReport,
)


class KVEventSink(Protocol):
    """Where a worker publishes what its engine did; called on the engine's event loop."""

    def on_kv_events(self, events: list[KVEvent]) -> None: ...

    def on_load(self, load: LoadReport) -> None: ...


class NullKVEventSink:
    def on_kv_events(self, events: list[KVEvent]) -> None:
        pass

    def on_load(self, load: LoadReport) -> None:
        pass


class ServingEngine(Protocol):
    name: str
    """Announced in ``InstanceInfo.metadata["engine"]`` (``names.ENGINES``, or ``fake``)."""

    @property
    def block_size(self) -> int: ...

    @property
    def kv_blocks_total(self) -> int: ...

    @property
    def context_length(self) -> int: ...

    def start(self, sink: KVEventSink) -> None: ...

    def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]: ...

    def load(self) -> LoadReport: ...

    async def kv_snapshot(self) -> list[KVEvent]: ...

    async def kv_state(self) -> dict[str, list[int]]: ...

    async def pool_status(self) -> tuple[int, int, str]:
        """(KV blocks used, KV blocks total, integrity error or "")."""
        ...

    async def load_weights(self) -> float:
        """Bring weights an idle model offloaded back now (the router's prefetch): seconds it
        took, 0 when they were in or never leave."""
        ...

    def problem(self) -> str | None: ...

    def announce(self) -> dict[str, str]:
        """More ``InstanceInfo.metadata`` for the worker to register (``kv_connector``:
        the guest engine's KV hand-off, which a router pairs only with the same kind)."""
        ...

    def handoff_counts(self) -> dict[str, int]:
        """The engine's own KV hand-offs by outcome (a worker's control ``status``)."""
        ...

    async def shutdown(self) -> None: ...


class FixedSizes:
    """The sizes a worker announces (``ServingEngine.block_size``, ``kv_blocks_total``,
    ``context_length``), for an engine that knows them once it is built (the fake, vLLM's)."""

    def __init__(self, block_size: int, kv_blocks_total: int, context_length: int) -> None:
        self._block_size = block_size
        self._num_blocks = kv_blocks_total
        self._context_length = context_length

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def kv_blocks_total(self) -> int:
        return self._num_blocks

    @property
    def context_length(self) -> int:
        return self._context_length


class FakeEngine(FixedSizes):
    """A deterministic engine for tests of what sits above the seam: output token i of a
    request is ``(last prompt token + 1 + i) % vocab``, one token per ``step_s``; every full
    block of a prompt is announced as stored (``kvhash``), cached ones count as cached tokens.

    Its cache holds ``num_blocks`` as an engine's does: the blocks of running requests are in
    use (what its load reports), the rest are cached and evicted least recently used first (a
    request's last blocks before its first, as vLLM frees them), each eviction announced as
    removed. A cache that only grew, reported whole as in use, marked every worker of a long
    fleet simulation busy by KV usage while they were idle."""

    name = "fake"

    def __init__(self, *, block_size: int = 16, num_blocks: int = 1024, step_s: float = 0.001) -> None:
        super().__init__(block_size, num_blocks, context_length=2048)
        self._step_s = step_s
        self._sink: KVEventSink = NullKVEventSink()
        self._stored: dict[int, int] = {}
        """Block hash -> its parent's hash, least recently used first."""
        self._held: dict[int, int] = {}
        """Block hash -> running requests using it (the blocks in use)."""
        self._running = 0
        self._dead: str | None = None
        self.vocab = 49152

    def start(self, sink: KVEventSink) -> None:
        self._sink = sink

    def announce(self) -> dict[str, str]:
        return {}

    def handoff_counts(self) -> dict[str, int]:
        return {}

    def kill(self, why: str = "the fake engine died") -> None:
        self._dead = why

    def problem(self) -> str | None:
        return self._dead

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        hashes = hash_blocks(req.token_ids, self._block_size)
        cached = 0
        for h in hashes:
            if h not in self._stored:
                break
            cached += self._block_size
        new = [h for h in hashes if h not in self._stored]
        parents = [0, *hashes[:-1]]
        for h, parent in reversed(list(zip(hashes, parents, strict=True))):
            self._stored[h] = self._stored.pop(h, parent)  # most recent: the prompt's first block
            self._held[h] = self._held.get(h, 0) + 1
        self._running += 1
        try:  # from here on the blocks are held: whatever ends the request lets them go
            if new:
                self._sink.on_kv_events(self._events(new))
            self._evict()
            last = req.token_ids[-1] if req.token_ids else 0
            done = len(req.resume_token_ids)
            for i in range(done, req.sampling.max_tokens):
                await asyncio.sleep(self._step_s)
                finish = "length" if i + 1 == req.sampling.max_tokens else None
                yield GenerateOutput(
                    request_id=req.request_id,
                    token_ids=((last + 1 + i) % self.vocab,),
                    finish_reason=finish,
                    num_prompt_tokens=len(req.token_ids),
                    num_cached_tokens=cached,
                )
        finally:
            self._running -= 1
            for h in hashes:
                left = self._held.pop(h, 1) - 1
                if left:
                    self._held[h] = left
            self._evict()
        self._sink.on_load(self.load())

    def _evict(self) -> None:
        """Drop the least recently used blocks no running request uses while over ``num_blocks``."""
        over = len(self._stored) - self._num_blocks
        if over <= 0:
            return
        gone = list(itertools.islice((h for h in self._stored if h not in self._held), over))
        for h in gone:
            del self._stored[h]
        if gone:
            self._sink.on_kv_events([BlockRemoved(block_hashes=tuple(gone))])

    def fill(self, hashes: Sequence[int], *, announce: bool = True) -> None:
        """Hold ``hashes`` as one cached chain (a synthetic cache: fleet simulations, tests);
        ``announce``: as KV events, as a prompt's blocks are."""
        parent = 0
        new = []
        for h in hashes:
            if h not in self._stored:
                self._stored[h] = parent
                new.append(h)
            parent = h
        if new and announce:
            self._sink.on_kv_events(self._events(new))
        self._evict()

    def _events(self, hashes: list[int]) -> list[KVEvent]:
        return [
            BlockStored(
                block_hashes=(h,),
                parent_block_hash=self._stored[h] or None,
                block_size=self._block_size,
            )
            for h in hashes
        ]

    def load(self) -> LoadReport:
        return LoadReport(
            instance_id="",
            timestamp=time.time(),
            num_running=self._running,
            num_waiting=0,
            kv_blocks_used=len(self._held),
            kv_blocks_total=self._num_blocks,
            queued_prefill_tokens=0,
            step_time_s=self._step_s,
            tokens_computed=self._running,
        )

    async def kv_snapshot(self) -> list[KVEvent]:
        return [AllBlocksCleared(), *self._events(list(self._stored))]

    async def kv_state(self) -> dict[str, list[int]]:
        return {"device": list(self._stored)}

    async def pool_status(self) -> tuple[int, int, str]:
        return len(self._held), self._num_blocks, ""

    async def load_weights(self) -> float:
        return 0.0  # the fake has no weights

    async def shutdown(self) -> None:
        self._dead = self._dead or "shut down"
