from __future__ import annotations

import pytest

from interlock.engine.timing import TimingModel
from interlock.protocol.events import BlockRemoved, BlockStored, KVEventBatch, LoadReport
from interlock.sim.engine_worker import EngineWorker
from interlock.sim.synthetic import SharedPrefixSpec, shared_prefix_requests
from interlock.sim.trace import SimRequest
from interlock.sim.worker import SimSeq, SimWorker, WorkerShape, WorkerSink


class Sink(WorkerSink):
    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.done: dict[str, SimSeq] = {}
        self.batches: list[KVEventBatch] = []
        self.loads: list[tuple[float, LoadReport]] = []
        self.wakes: list[tuple[float, float, int]] = []
        self.now = 0.0

    def load(self, report) -> None:
        self.loads.append((self.now, report))

    def wake(self, worker, t, asked_at=None) -> None:
        self.wakes.append((t, self.now if asked_at is None else asked_at, len(self.wakes)))
        self.wakes.sort()

    def first_token(self, worker, seq, t) -> None:
        self.first[seq.req.request_id] = t

    def finished(self, worker, seq, t) -> None:
        self.done[seq.req.request_id] = seq

    def kv_events(self, batch) -> None:
        self.batches.append(batch)


def run(w: SimWorker | EngineWorker, arrivals: list[tuple[float, SimRequest]]) -> float:
    """Drive one worker as the replay's driver does: arrivals at the given times, steps in
    between, the pacing timers it asks for (a timer goes after a step or an arrival due at the
    same time). Returns when its last step ended."""
    sink = w.sink
    assert isinstance(sink, Sink)
    now, end = 0.0, None
    pending = sorted(arrivals, key=lambda a: a[0])
    while pending or end is not None or sink.wakes:
        nxt = min([t for t in (end, pending[0][0] if pending else None) if t is not None], default=None)
        if sink.wakes and (nxt is None or sink.wakes[0][0] < nxt):
            t = sink.wakes.pop(0)[0]
            sink.now = t
            got = w.send_held_load(t)
            if isinstance(w, SimWorker) and w.step is not None and w.step.k > 1:
                end = got  # a stretch's next event is what the tick says (None: a later tick)
        elif end is not None and (not pending or end <= pending[0][0]):
            now = sink.now = end
            w.finish_step(now)
            end = w.start_step(now)
        else:
            now, req = pending.pop(0)
            sink.now = now
            w.enqueue(req, now)
            end = w.start_step(now) if w.step is None else (w.cut(now) or end)
        if isinstance(w, SimWorker):
            w.check_integrity()
    return now


def req(rid: str, blocks: tuple[int, ...], prompt: int, out: int = 3) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, out, blocks)


def test_second_request_hits_the_prefix_and_events_are_published() -> None:
    sink = Sink()
    w = SimWorker("w", WorkerShape(num_blocks=100, block_size=16), sink=sink)
    run(w, [(0.0, req("a", (1, 2, 3, 4), 64)), (1.0, req("b", (1, 2, 3, 9), 64))])
    assert sink.done["a"].hit_tokens == 0 and sink.done["b"].hit_tokens == 48
    stored = [h for b in sink.batches for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == [1, 2, 3, 4, 9]
    assert [b.seq for b in sink.batches] == list(range(len(sink.batches)))
    # TTFT of "a" is one prefill step of 64 tokens: the timing model, exactly
    assert abs(sink.first["a"] - TimingModel().step_s(64, 0, 64 / 1600)) < 1e-12


def test_lru_evicts_old_prefixes_and_publishes_removals() -> None:
    sink = Sink()
    w = SimWorker("w", WorkerShape(num_blocks=8, block_size=16), sink=sink)
    run(
        w,
        [
            (0.0, req("a", (1, 2, 3), 50, out=1)),
            (1.0, req("b", (4, 5, 6), 50, out=1)),
            (2.0, req("c", (7, 8, 9), 50, out=1)),
            (3.0, req("d", (1, 2, 3), 50, out=1)),
        ],
    )
    removed = [
        h for b in sink.batches for e in b.events if isinstance(e, BlockRemoved) for h in e.block_hashes
    ]
    # a request's tail goes first, so "a"'s first block outlives its others
    assert removed[:2] == [3, 2] and sink.done["d"].hit_tokens == 16
    snap = w.snapshot(4.0)
    assert snap.snapshot and snap.seq == len(sink.batches) - 1


def test_decode_macro_steps_match_step_by_step_time() -> None:
    timing = TimingModel()
    w = SimWorker("w", WorkerShape(num_blocks=1000, block_size=16, timing=timing), sink=Sink())
    ctx, n, k = 5000, 7, 40
    by_step = sum(timing.step_s(0, n, (ctx + i * n) / 16000) for i in range(k))
    assert abs(w._decode_span(ctx, n, k) - by_step) < 1e-9


def test_an_arrival_cuts_a_decode_macro_step() -> None:
    sink = Sink()
    w = SimWorker("w", WorkerShape(num_blocks=1000, block_size=16), sink=sink)
    run(w, [(0.0, req("long", (1,), 20, out=2000)), (1.0, req("late", (2,), 20, out=2))])
    # "late" starts at the first step boundary after its arrival, not after "long" ends
    assert sink.first["late"] - 1.0 < 0.05
    assert sink.done["long"].finish_s > sink.done["late"].finish_s


@pytest.mark.parametrize(
    ("num_blocks", "budget", "rate"), [(60, 256, 20.0), (45, 256, 30.0), (200, 64, 50.0), (30, 8192, 5.0)]
)
def test_every_request_times_exactly_as_on_the_engine(num_blocks, budget, rate) -> None:
    """One worker, the same arrivals, against EngineCore + MockRunner: chunked prefill, prefix
    hits, multi-turn sessions and (with the smaller pools) preemption by recompute."""
    bs = 64 if budget == 8192 else 16
    spec = SharedPrefixSpec(
        num_requests=40,
        num_groups=2,
        system_tokens=200,
        suffix_tokens=60,
        output_tokens=40,
        turns=2,
        think_time_s=0.5,
        rate=rate,
        block_size=bs,
        seed=1,
        keep_tokens=True,
    )
    reqs = shared_prefix_requests(spec)
    sinks = []
    for make in (SimWorker, EngineWorker):
        sink = Sink()
        shape = WorkerShape(
            num_blocks=num_blocks, block_size=bs, max_num_batched_tokens=budget, max_num_seqs=8
        )
        w = make("w", shape, sink=sink)
        run(w, [(r.arrival_s, r) for r in reqs])
        sinks.append(sink)
        if isinstance(w, SimWorker):
            preemptions = w.num_preemptions
    fast, engine = sinks
    for r in reqs:
        rid = r.request_id
        assert abs(fast.first[rid] - engine.first[rid]) < 1e-9, rid
        assert abs(fast.done[rid].finish_s - engine.done[rid].finish_s) < 1e-9, rid
        assert fast.done[rid].hit_tokens == engine.done[rid].hit_tokens, rid
    assert preemptions > 0 or num_blocks >= 200


def test_no_blocks_are_reserved_for_the_output_up_front() -> None:
    # 10 blocks of 16: each request needs 4 for its prompt and 8 once its 64 outputs are in
    sink = Sink()
    w = SimWorker("w", WorkerShape(num_blocks=10, block_size=16), watermark=0.0, sink=sink)
    run(w, [(0.0, req("a", (1, 2, 3, 4), 64, out=64)), (0.0, req("b", (5, 6, 7, 8), 64, out=64))])
    # "b" starts while "a" decodes (reserving a's output would have made it wait for a's end)
    assert sink.first["b"] < sink.first["a"] + 0.1 < sink.done["a"].finish_s
    assert w.num_preemptions == 1  # and it gave way when the blocks ran out (the newest goes)
    assert sink.done["b"].finish_s > sink.done["a"].finish_s


@pytest.mark.parametrize("make", [SimWorker, EngineWorker])
def test_load_reports_are_paced_as_a_deployed_worker_sends_them(make) -> None:
    """At most one report per interval reaches the router, each saying how long it was held,
    and the last one (the worker idle) arrives within the interval of the last step."""
    spec = SharedPrefixSpec(
        num_requests=30, num_groups=2, system_tokens=200, suffix_tokens=60, output_tokens=40,
        turns=1, rate=20.0, block_size=16, seed=2, keep_tokens=True,
    )  # fmt: skip
    sink = Sink()
    w = make("w", WorkerShape(num_blocks=200, block_size=16, report_interval_s=0.05), sink=sink)
    now = run(w, [(r.arrival_s, r) for r in shared_prefix_requests(spec)])
    times = [t for t, _ in sink.loads]
    assert len(times) > 10 and all(b - a >= 0.05 - 1e-12 for a, b in zip(times, times[1:], strict=False))
    assert any(r.held_s > 0 for _, r in sink.loads)
    assert all(0 <= r.held_s < 0.05 for _, r in sink.loads)
    last_t, last = sink.loads[-1]
    assert last.num_running == last.num_waiting == 0 and last_t <= now + 0.05 + 1e-12
