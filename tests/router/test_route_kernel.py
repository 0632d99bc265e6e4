"""The compiled ``kv`` decision (``route_kernel``) against the numpy path it replaces: the same
costs to the last bit, the same ranked candidates, the same choice; and numpy where the
kernel cannot be built or is switched off."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import interlock.router.route_kernel as route_kernel
from interlock.env import get_env
from interlock.names import STALL_OVER
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch, LoadReport
from interlock.router import Decision, RequestMeta, Router, RouterConfig, native
from interlock.router.cost import CostParams, cheapest, choose, ttft_costs, uncached_tokens_of
from interlock.router.route_kernel import CompiledDecider, RouteKernel

LIB = route_kernel.load()
needs_kernel = pytest.mark.skipif(LIB is None, reason="no C compiler: the kernel is not built here")

# Few distinct values, so that equal costs (ties) are common.
FEW = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 7.0, 100.0])
SPEED = st.sampled_from([1e-4, 2e-4, 5e-4, 1e-3])


@st.composite
def cases(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 40))  # past 4, the AVX2 passes run four workers at a time
    vec = lambda elem: np.array(draw(st.lists(elem, min_size=n, max_size=n)), dtype=np.float64)  # noqa: E731
    params = CostParams(
        block_size=draw(st.sampled_from([1, 16])),
        chunk_tokens=draw(st.sampled_from([64, 512, 8192])),
        kv_watermark=draw(st.sampled_from([0.5, 0.7, 1.0])),
        kv_penalty=draw(st.sampled_from([0.0, 0.0, 4.0])),
        miss_weight=draw(st.sampled_from([1.0, 3.0, 0.0])),
        decode_weight=draw(st.sampled_from([0.0, 0.15, 0.225])),
        backlog_charge=draw(st.booleans()),
        stall_weight=draw(st.sampled_from([0.0, 1.0, 0.5])),
        tie_tolerance_s=draw(st.sampled_from([0.0, 1e-3, 1.0])),
        idle_replicas=draw(st.booleans()),
    )
    lower = draw(st.booleans())
    overlaps = np.array(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.int32)
    if draw(st.booleans()):  # a prefix several workers hold (cost._idle_replicas)
        overlaps[np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))] = overlaps.max()
    queued = vec(st.sampled_from([0.0, 16.0, 300.0, 9000.0, 0.1, 1e15 / 3]))
    waiting = vec(FEW) if draw(st.booleans()) else None
    decoding = vec(st.sampled_from([0.0, 1.0, 3.0])) if draw(st.booleans()) else None
    if draw(st.booleans()):  # idle workers: nothing queued, waiting or decoding
        quiet = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        for v in (queued, waiting, decoding):
            if v is not None:
                v[quiet] = 0.0
    return {
        **left_slots(draw, queued),
        "n": n,
        "params": params,
        "prompt": draw(st.integers(1, 700)),
        "overlaps": overlaps,
        "lower": np.array(draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)), dtype=np.int32)
        if lower
        else None,
        "per_token": vec(SPEED),
        "overhead": vec(st.sampled_from([0.01, 0.02])),
        "decode_step": vec(st.sampled_from([0.01, 0.03])),
        "decode_tokens": draw(st.sampled_from([0, 1, 200])),
        "kv": vec(st.sampled_from([0.0, 0.5, 0.8, 1.0])),
        "waiting": waiting,
        "decoding": decoding,
        "load_s": vec(st.sampled_from([1e-4, 1e-3])),
        "room": draw(st.booleans()),
        "free": vec(st.sampled_from([0.0, 10.0, 1e6, np.inf])),
        "used": vec(st.sampled_from([0.0, 0.5, 20.0, 500.0])),
        "weight": vec(st.sampled_from([0.25, 1.0])) if draw(st.booleans()) else None,
        "eligible": np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        if draw(st.booleans())
        else None,
        "busy": vec(st.sampled_from([0.0, 1.0, 2.0])),
        "rotation": draw(st.integers(0, 1000)),
        "k": draw(st.integers(1, 6)),
    }


def left_slots(draw: st.DrawFn, queued: np.ndarray) -> dict:
    """``queued`` and ``fleet`` for a case, with the slots of workers that left (queue 0, not
    counted in the backlog's mean) in about half of the cases."""
    n = len(queued)
    if not draw(st.booleans()):
        return {"queued": queued, "fleet": None}
    gone = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    gone[draw(st.integers(0, n - 1))] = False  # one worker at least
    queued[gone] = 0.0
    return {"queued": queued, "fleet": int(n - gone.sum())}


def numpy_decision(c: dict) -> tuple[np.ndarray, list[int], int]:
    """What the router computes without the kernel."""
    p: CostParams = c["params"]
    costs = ttft_costs(
        p,
        prompt_tokens=c["prompt"],
        overlap_blocks=c["overlaps"],
        lower_blocks=c["lower"],
        load_s_per_block=c["load_s"] if c["lower"] is not None else None,
        queued_prefill=c["queued"],
        per_token_s=c["per_token"],
        step_overhead_s=c["overhead"],
        decode_step_s=c["decode_step"],
        kv_usage=c["kv"],
        decode_tokens=c["decode_tokens"],
        waiting=c["waiting"],
        decoding=c["decoding"],
        backlog_workers=c.get("fleet"),
        **(
            {
                "free_blocks": c["free"],
                "used_blocks": c["used"],
                "drain_s": c["decode_step"] * max(c["decode_tokens"], 1),
            }
            if c["room"]
            else {}
        ),
    )
    if c["weight"] is not None:
        costs = costs / c["weight"]
    eligible = c["eligible"] if c["eligible"] is not None else np.ones(c["n"], dtype=bool)
    if not eligible.any():
        return costs, [], -1
    ranked = cheapest(costs, c["eligible"], c["k"])
    slot = choose(
        costs, eligible, c["busy"], tolerance=p.tie_tolerance_s, rotation=c["rotation"], ranked=ranked
    )
    return costs, ranked, slot


def kernel_decision(kernel: RouteKernel, c: dict) -> tuple[np.ndarray, list[int], int]:
    p: CostParams = c["params"]
    uncached = uncached_tokens_of(p, c["prompt"], c["overlaps"], c["lower"]).astype(np.float64)
    costs, ranked, slot = kernel.decide(
        p,
        c["n"],
        uncached=uncached,
        queued=c["queued"],
        per_token=c["per_token"],
        overhead=c["overhead"],
        decode_step=c["decode_step"],
        decode_tokens=c["decode_tokens"],
        kv_usage=c["kv"],
        busy=c["busy"],
        k=c["k"],
        rotation=c["rotation"],
        waiting=c["waiting"],
        decoding=c["decoding"],
        lower=c["lower"].astype(np.float64) if c["lower"] is not None else None,
        load_s=c["load_s"] if c["lower"] is not None else None,
        free=c["free"] if c["room"] else None,
        used=c["used"] if c["room"] else None,
        drain_tokens=c["decode_tokens"],
        weight=c["weight"],
        eligible=c["eligible"],
        fleet=c.get("fleet"),
    )
    return costs.copy(), ranked, slot


@needs_kernel
@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_kernel_decides_as_numpy_to_the_last_bit(c: dict) -> None:
    assert LIB is not None
    kernel = RouteKernel(LIB)
    want_costs, want_ranked, want_slot = numpy_decision(c)
    costs, ranked, slot = kernel_decision(kernel, c)
    assert costs.tobytes() == want_costs.tobytes()
    if slot >= 0:  # else the router lets numpy choose, over these same costs
        assert (ranked, slot) == (want_ranked, want_slot)
    else:
        assert want_slot == -1 or not want_ranked or np.isnan(costs).any()


@needs_kernel
def test_idle_workers_that_could_copy_a_shared_prefix_cost_the_same_in_both_passes() -> None:
    """``cost._idle_replicas`` in the kernel's AVX2 first pass (room priced, a decode term, no
    tiers, no KV penalty) and its scalar loop (with lower tiers) alike, on states where it
    applies: a prefix two or more workers hold, workers with nothing queued, waiting or
    decoding."""
    assert LIB is not None
    kernel = RouteKernel(LIB)
    rng = np.random.default_rng(7)
    discounted = 0
    for trial in range(300):
        n = int(rng.integers(2, 23))
        quiet = rng.random(n) < 0.4
        overlaps = rng.integers(0, 5, n).astype(np.int32)
        overlaps[rng.random(n) < 0.5] = 6  # the longest prefix, most often held by several
        queued, waiting, decoding = (np.where(quiet, 0.0, rng.choice([16.0, 300.0], n)) for _ in range(3))
        c = {
            "n": n, "params": CostParams(block_size=16, chunk_tokens=512), "prompt": 200,
            "overlaps": overlaps, "lower": rng.integers(0, 3, n).astype(np.int32) if trial % 3 == 0 else None,
            "queued": queued, "fleet": None, "per_token": rng.choice([1e-4, 3e-4], n),
            "overhead": rng.choice([0.01, 0.02], n), "decode_step": rng.choice([0.01, 0.03], n),
            "decode_tokens": 200, "kv": np.zeros(n), "waiting": waiting, "decoding": decoding,
            "load_s": np.full(n, 1e-3), "room": True, "free": np.full(n, 1e6), "used": np.full(n, 20.0),
            "weight": None, "eligible": None, "busy": np.zeros(n), "rotation": trial, "k": 4,
        }  # fmt: skip
        want_costs, want_ranked, want_slot = numpy_decision(c)
        costs, ranked, slot = kernel_decision(kernel, c)
        assert costs.tobytes() == want_costs.tobytes(), trial
        assert (ranked, slot) == (want_ranked, want_slot)
        plain = numpy_decision(
            {**c, "params": CostParams(block_size=16, chunk_tokens=512, idle_replicas=False)}
        )[0]
        discounted += int((costs < plain).any())
        assert ((costs < plain) <= quiet).all()  # only idle workers are charged less
    assert discounted > 100  # the discount applied in most trials


@needs_kernel
def test_the_kernel_refuses_short_or_mistyped_vectors() -> None:
    assert LIB is not None
    kernel = RouteKernel(LIB)
    c = {
        "n": 4,
        "params": CostParams(),
        "prompt": 100,
        "overlaps": np.zeros(4, dtype=np.int32),
        "lower": None,
        "queued": np.zeros(3),  # one short
        "per_token": np.ones(4),
        "overhead": np.ones(4),
        "decode_step": np.ones(4),
        "decode_tokens": 1,
        "kv": np.zeros(4),
        "waiting": None,
        "decoding": None,
        "load_s": np.ones(4),
        "room": False,
        "free": np.ones(4),
        "used": np.ones(4),
        "weight": None,
        "eligible": None,
        "busy": np.zeros(4),
        "rotation": 0,
        "k": 2,
    }
    with pytest.raises(ValueError, match="needs 4 workers' values, got 3"):
        kernel_decision(kernel, c)
    c["queued"] = np.zeros(4, dtype=np.int64)
    with pytest.raises(TypeError, match="float64 or bool"):
        kernel_decision(kernel, c)
    c["queued"], c["k"] = np.zeros(4), route_kernel.MAX_RANKED + 1
    with pytest.raises(ValueError, match="k must be in"):
        kernel_decision(kernel, c)
    c["k"] = 2
    for fleet in (0, 5):  # the backlog's mean over more workers than slots, or none
        with pytest.raises(ValueError, match=f"fleet must be in 1..4 workers, got {fleet}"):
            kernel_decision(kernel, {**c, "fleet": fleet})


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 8, 9, 23, 128, 129, 136, 300, 1024, 1500])
@pytest.mark.parametrize("waiting", [False, True])
def test_the_backlog_is_the_mean_numpy_takes(n: int, waiting: bool) -> None:
    # The fleet's mean queue is summed as numpy sums (eight running sums, halves past 128):
    # with fractional queues of many magnitudes the order changes the sum, and so the costs.
    assert LIB is not None
    for seed in range(100):  # from 9 values on, data where a plain running sum is another double
        rng = np.random.default_rng(seed)
        queued = rng.random(n) * 10.0 ** rng.integers(0, 13, n)
        if n < 9 or sum(queued.tolist()) != float(np.add.reduce(queued)):
            break
    else:
        raise AssertionError("no data to tell the sums apart")
    ones = np.ones(n)
    c = {
        "n": n,
        "params": CostParams(chunk_tokens=1, decode_weight=0.0, price_room=False),
        "prompt": 1000,
        "overlaps": np.zeros(n, dtype=np.int32),
        "lower": None,
        "queued": queued,
        "per_token": ones,
        "overhead": ones,
        "decode_step": ones,
        "decode_tokens": 0,
        "kv": np.zeros(n),
        "waiting": ones if waiting else None,
        "decoding": None,
        "load_s": ones,
        "room": False,
        "free": ones,
        "used": ones,
        "weight": None,
        "eligible": None,
        "busy": np.zeros(n),
        "rotation": 0,
        "k": 2,
    }
    want_costs, want_ranked, want_slot = numpy_decision(c)
    costs, ranked, slot = kernel_decision(RouteKernel(LIB), c)
    assert costs.tobytes() == want_costs.tobytes()
    assert (ranked, slot) == (want_ranked, want_slot)


def _routes(seed: int, stall_over: str = "decoding") -> list[tuple[str, tuple[tuple[str, float], ...]]]:
    """A small fleet's decisions: shared prefixes, load reports, in-flight requests, some of
    them past their first token."""
    rng = random.Random(seed)
    cost = CostParams(stall_over=stall_over)
    r = Router(RouterConfig(block_size=4, seed=0, cost=cost), clock=lambda: 0.0)
    for w in range(12):
        r.add_worker(
            InstanceInfo(
                instance_id=f"w{w}",
                endpoint="ns.worker.generate",
                model="m",
                block_size=4,
                kv_blocks_total=200,
            )
        )
    for wid in r.needs_resync():
        r.apply_events(KVEventBatch(instance_id=wid, seq=-1, timestamp=0.0, events=(), snapshot=True))
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(4, 40))] for _ in range(6)]
    seqs = [0] * 12
    for w in range(12):
        for _ in range(2):
            tokens = rng.choice(prefixes)
            hashes = r.block_hashes(tokens)
            ev = BlockStored(block_hashes=tuple(hashes), parent_block_hash=None)
            r.apply_events(KVEventBatch(instance_id=f"w{w}", seq=seqs[w], timestamp=0.0, events=(ev,)))
            seqs[w] += 1
    out = []
    inflight: list[str] = []
    for i in range(150):
        w = rng.randrange(12)
        r.apply_load(
            LoadReport(
                instance_id=f"w{w}",
                timestamp=float(i),
                num_running=rng.randint(0, 4),
                num_waiting=rng.randint(0, 3),
                kv_blocks_used=rng.randint(0, 200),
                kv_blocks_total=200,
                queued_prefill_tokens=rng.choice([0, 50, 4000]),
                step_time_s=rng.choice([0.02, 0.05]),
                tokens_computed=rng.choice([1, 300, 2000]),
                decode_step_s=rng.choice([0.0, 0.02]),
            )
        )
        tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(1, 30))]
        d = r.route(RequestMeta(f"r{i}", len(tokens), max_tokens=rng.choice([1, 64, 512])), token_ids=tokens)
        if isinstance(d, Decision):
            out.append((d.worker_id, tuple((c.worker_id, c.cost_s) for c in d.candidates)))
            inflight.append(f"r{i}")
            if rng.random() < 0.5:
                r.on_first_token(f"r{i}")
        if len(inflight) > 20:
            r.on_finish(inflight.pop(rng.randrange(len(inflight))))
        out.extend((d.worker_id, ()) for d in r.dispatch_queued())
    return out


@pytest.fixture
def fresh_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """``get_env``, ``route_kernel.load`` and ``native.load`` read again, in an empty cache
    folder; restored after."""
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INTERLOCK_CPU_KERNELS", raising=False)  # a suite run with kernels off
    get_env.cache_clear()
    route_kernel.load.cache_clear()
    native.load.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_env.cache_clear()
    route_kernel.load.cache_clear()
    native.load.cache_clear()


@needs_kernel
@pytest.mark.parametrize("over", STALL_OVER)
def test_a_router_decides_the_same_with_or_without_the_kernel(
    fresh_env: pytest.MonkeyPatch, over: str
) -> None:
    with_kernel = _routes(7, over)  # the compiled index and decision in one call, where it builds
    if native.load() is not None:  # the kernel alone over the Python index (no Python headers)
        with pytest.MonkeyPatch.context() as no_index:
            no_index.setattr(native, "load", lambda: None)
            r = Router(RouterConfig())
            assert not r.indexer.compiled and isinstance(r.decider, CompiledDecider)
            assert r.decider.kernel.has_library
            assert _routes(7, over) == with_kernel
    fresh_env.setenv("INTERLOCK_CPU_KERNELS", "0")
    get_env.cache_clear()
    route_kernel.load.cache_clear()
    native.load.cache_clear()
    assert Router(RouterConfig()).decider.name == "reference"
    assert _routes(7, over) == with_kernel


def _survivors_prices(grown: int, kernels: str) -> list[tuple[tuple[str, float], ...]]:
    """The candidates (and their costs) of misses routed over eight workers with queues, in a
    router that had ``grown`` workers before all but those eight left."""
    r = Router(RouterConfig(block_size=4, seed=0), clock=lambda: 0.0)
    assert (r.decider.name == "reference") == (kernels == "numpy")
    for w in range(grown):
        r.add_worker(
            InstanceInfo(instance_id=f"w{w}", endpoint="e", model="m", block_size=4, kv_blocks_total=900)
        )
    for w in range(8, grown):
        r.remove_worker(f"w{w}")
    for w in range(8):
        report = LoadReport(
            instance_id=f"w{w}", timestamp=1.0, num_running=2, num_waiting=0, kv_blocks_used=100,
            kv_blocks_total=900, queued_prefill_tokens=4000 * w, step_time_s=0.05, tokens_computed=2000,
        )  # fmt: skip
        r.apply_load(report)
    out = []
    for i in range(3):
        d = r.route(RequestMeta(f"r{i}", 500, max_tokens=64), token_ids=list(range(i, i + 500)))
        assert isinstance(d, Decision)
        out.append(tuple((c.worker_id, c.cost_s) for c in d.candidates))
    return out


@pytest.mark.parametrize("kernels", ["compiled", "kernel", "numpy"])
def test_a_shrunk_fleet_prices_the_backlog_as_one_that_never_grew(
    fresh_env: pytest.MonkeyPatch, kernels: str
) -> None:
    # The slots of the 32 workers that left hold empty queues: counted in the fleet's mean
    # backlog, they cut a miss's charge by up to 5x.
    if kernels == "numpy":
        fresh_env.setenv("INTERLOCK_CPU_KERNELS", "0")
        get_env.cache_clear()
    elif kernels == "kernel":  # the kernel alone, over the Python index
        fresh_env.setattr(native, "load", lambda: None)
    router = Router(RouterConfig())
    if kernels != "numpy" and (
        router.decider.name == "reference" or router.indexer.compiled != (kernels == "compiled")
    ):
        pytest.skip("no C compiler (or no Python headers): that kernel is not built here")
    assert _survivors_prices(40, kernels) == _survivors_prices(8, kernels)


def test_without_a_compiler_the_router_decides_with_numpy(
    fresh_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh_env.setenv("PATH", "")  # no cc, and nothing built in the fresh cache folder
    assert route_kernel.load() is None
    assert native.load() is None
    assert "no C compiler" in caplog.text
    assert Router(RouterConfig()).decider.name == "reference"
    assert len(_routes(3)) > 100


def test_the_kernel_mirrors_cost_py() -> None:
    # Fails when router/cost.py's formula changes: bring csrc/route_kv.c (and kvindex.c's
    # decide) in line with it, then set route_kernel.MIRRORED to the new fingerprint.
    assert route_kernel.cost_fingerprint() == route_kernel.MIRRORED, (
        "router/cost.py changed: the compiled decision is off (numpy decides) until route_kv.c mirrors it"
    )


@needs_kernel
def test_a_changed_cost_formula_switches_the_kernel_off(
    fresh_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh_env.setattr(route_kernel, "MIRRORED", "0" * 16)
    route_kernel.mirrors_cost.cache_clear()
    try:
        assert Router(RouterConfig()).decider.name == "reference"
        assert "changed since csrc/route_kv.c mirrored it" in caplog.text
    finally:
        fresh_env.undo()
        route_kernel.mirrors_cost.cache_clear()
    assert Router(RouterConfig()).decider.name == "compiled"


@needs_kernel
@pytest.mark.parametrize(
    "uncached", [[0.0, 5.0, 64.0], [0.0, 5.0, 65.0], [-3.0, 200.0, 1.0], [np.nan, 3.0, 1.0]]
)
def test_the_stall_takes_numpys_step_count_at_its_edges(uncached: list[float]) -> None:
    # numpy prices one prefill step everywhere when no uncached part passes a chunk (a worker
    # with nothing to compute included), else ceil(uncached / chunk) (0 for nothing)
    assert LIB is not None
    u, ones = np.array(uncached), np.ones(3)
    p = CostParams(chunk_tokens=64)
    vectors = {"queued_prefill": ones * 10.0, "per_token_s": ones * 1e-4, "step_overhead_s": ones * 0.02}
    with np.errstate(invalid="ignore"):
        want = ttft_costs(
            p,
            prompt_tokens=64,
            uncached_tokens=u,
            decode_step_s=ones * 0.03,
            kv_usage=ones * 0.0,
            decoding=ones * 2.0,
            **vectors,
        )
    costs, _, _ = RouteKernel(LIB).decide(
        p,
        3,
        uncached=u,
        queued=vectors["queued_prefill"],
        per_token=vectors["per_token_s"],
        overhead=vectors["step_overhead_s"],
        decode_step=ones * 0.03,
        decode_tokens=0,
        kv_usage=ones * 0.0,
        busy=ones * 0.0,
        k=2,
        rotation=0,
        decoding=ones * 2.0,
    )
    assert costs.tobytes() == want.tobytes()
