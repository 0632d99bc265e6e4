from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from interlock.protocol.events import LoadReport, RouterLoadEvent, TierStats
from interlock.router import native
from interlock.router.load import (
    _VECTORS,
    ACCOUNT_VECTORS,
    DECODE_CONTEXT_SLOPE,
    DEFAULT_PREFILL_TPS,
    MAX_DECODE_CONTEXT,
    LoadTracker,
)
from interlock.router.speed import StepTimeFit


def report(
    slot_id: str = "w0",
    *,
    t: float = 1.0,
    queued: int = 0,
    running: int = 0,
    step_s: float = 0.0,
    tokens: int = 0,
    tps: float = 0.0,
) -> LoadReport:
    return LoadReport(
        instance_id=slot_id,
        timestamp=t,
        num_running=running,
        num_waiting=0,
        kv_blocks_used=10,
        kv_blocks_total=100,
        queued_prefill_tokens=queued,
        step_time_s=step_s,
        tokens_computed=tokens,
        prefill_tokens_per_s=tps,
    )


def tracker() -> LoadTracker:
    lt = LoadTracker("r1", capacity=2)
    for slot in range(3):  # grows past the initial capacity
        lt.add_worker(slot, kv_blocks_total=100, block_size=10)
    return lt


def test_dispatch_accounting_route_first_token_finish() -> None:
    lt = tracker()
    lt.on_route("a", 1, "w1", prefill_tokens=300, kv_tokens=400, now=0.0)
    lt.on_route("b", 1, "w1", prefill_tokens=100, kv_tokens=200, now=0.0)
    assert lt.queued_prefill()[1] == 400 and lt.inflight[1] == 2
    assert lt.kv_usage()[1] == 0.6  # 600 of 1000 KV tokens
    lt.on_first_token("a")
    assert lt.queued_prefill()[1] == 100 and lt.decoding[1] == 1
    lt.on_finish("a")
    lt.on_finish("b")  # finished before its first token (aborted)
    assert lt.queued_prefill()[1] == 0 and lt.inflight[1] == 0 and lt.decoding[1] == 0
    assert [e.kind for e in lt.outbox] == ["route", "route", "first_token", "finish", "finish"]
    assert {e.instance_id for e in lt.outbox} == {"w1"}


def test_report_covers_earlier_dispatches_only() -> None:
    lt = tracker()
    lt.on_route("a", 0, "w0", prefill_tokens=1000, kv_tokens=1000, now=1.0)
    lt.apply_report(0, report(queued=600), now=2.0)  # a's prefill is under way: 600 left
    lt.on_route("b", 0, "w0", prefill_tokens=50, kv_tokens=50, now=3.0)
    assert lt.queued_prefill()[0] == 650
    lt.on_first_token("b")  # fresh work done before the next report
    assert lt.queued_prefill()[0] == 600
    lt.apply_report(0, report(t=0.5, queued=9999), now=4.0)  # older than what we have: ignored
    assert lt.queued_prefill()[0] == 600


def test_a_held_report_covers_only_dispatches_routed_before_it_was_made() -> None:
    # a paced worker (engine/pacing.py) sent at 2.0 a report it made at 1.96: "b", routed at
    # 1.98, is not in it and stays counted on top of it; "a", routed at 1.9, is in it
    lt = tracker()
    lt.on_route("a", 0, "w0", prefill_tokens=1000, kv_tokens=1000, now=1.9)
    lt.on_route("b", 0, "w0", prefill_tokens=50, kv_tokens=50, now=1.98)
    lt.apply_report(0, replace(report(queued=600), held_s=0.04), now=2.0)
    assert lt.queued_prefill()[0] == 650
    lt.apply_report(0, report(t=2.1, queued=640), now=2.1)  # made at once: covers both
    assert lt.queued_prefill()[0] == 640


def test_reports_fit_a_speed_line_and_unfitted_workers_use_the_fleet_median() -> None:
    lt = tracker()
    overhead, per_token = lt.speeds()
    assert per_token[0] == 1 / DEFAULT_PREFILL_TPS
    for i, tokens in enumerate([100, 4000, 800, 8000, 2000, 300]):
        lt.apply_report(0, report(t=i, step_s=0.01 + tokens * 2e-5, tokens=tokens, running=1), now=float(i))
    overhead, per_token = lt.speeds()
    assert abs(overhead[0] - 0.01) < 1e-6 and abs(per_token[0] - 2e-5) < 1e-9
    assert abs(per_token[2] - 2e-5) < 1e-9  # no fit of its own yet


def test_decode_step_of_a_cold_worker_and_the_fleet_line_over_context() -> None:
    lt = tracker()
    lt.apply_report(0, replace(report("w0"), decode_step_s=0.005), now=1.0)
    assert list(lt.decode_step()[:3]) == [0.005, 0.005, 0.005]  # cold ones: the fastest seen
    # the fleet line is fitted against the summed context of the requests (dispatched KV
    # tokens over the pool's), which is what a decode step reads
    for i, ctx in enumerate([100, 500, 900, 300, 700]):
        lt.on_route(f"q{i}", 1, "w1", prefill_tokens=0, kv_tokens=ctx, now=0.0)
        step = 0.005 + 0.01 * lt.context_usage(1)
        lt.apply_report(1, replace(report("w1", t=2.0 + i), decode_step_s=step), now=2.0 + i)
        lt.on_finish(f"q{i}")
    lt.on_route("x", 2, "w2", prefill_tokens=0, kv_tokens=500, now=9.0)
    step = lt.decode_step()
    assert abs(step[2] - 0.01) < 1e-9 and abs(step[1] - 0.005) < 1e-9


def test_decode_step_is_priced_at_no_more_context_than_the_kv_holds() -> None:
    # requests dispatched past a worker's KV wait in its queue and read nothing: a footprint
    # of 3x the KV (1,000 tokens) is priced as a full one, by the prior and by the fleet line
    lt = tracker()
    lt.apply_report(0, replace(report("w0"), decode_step_s=0.005), now=1.0)
    lt.on_route("big", 1, "w1", prefill_tokens=0, kv_tokens=3000, now=1.0)
    lt.on_route("full", 2, "w2", prefill_tokens=0, kv_tokens=1000, now=1.0)
    assert lt.context_usage(1) == 1.0
    step = lt.decode_step()
    assert step[1] == step[2] == 0.005 * (1 + DECODE_CONTEXT_SLOPE)
    for i, ctx in enumerate([100, 500, 900, 300, 700]):
        lt.on_route(f"q{i}", 0, "w0", prefill_tokens=0, kv_tokens=ctx, now=0.0)
        lt.apply_report(0, replace(report(t=2.0 + i), decode_step_s=0.005 + 0.01 * ctx / 1000), now=2.0 + i)
        lt.on_finish(f"q{i}")
    step = lt.decode_step()
    assert abs(step[1] - 0.015) < 1e-9 and abs(step[1] - step[2]) < 1e-12


def test_the_fleet_decode_line_is_kept_while_reports_span_no_context() -> None:
    # a saturated fleet: every worker's context at the cap, so recent reports cannot fit a
    # line; the prior would price 5x the fastest step reported (a loaded worker's) at the cap
    lt = tracker()
    for i, ctx in enumerate([100, 500, 900, 300, 700]):
        lt.on_route(f"q{i}", 0, "w0", prefill_tokens=0, kv_tokens=ctx, now=0.0)
        lt.apply_report(0, replace(report(t=1.0 + i), decode_step_s=0.005 + 0.01 * ctx / 1000), now=1.0 + i)
        lt.on_finish(f"q{i}")
    assert abs(lt.decode_step()[0] - 0.005) < 1e-9  # the line, at no context
    for slot in range(3):
        lt.on_route(f"full{slot}", slot, f"w{slot}", prefill_tokens=0, kv_tokens=1000, now=7.0)
    for i in range(2000):  # enough reports to forget the spread (the fit decays 1% each)
        lt.apply_report(i % 3, replace(report(f"w{i % 3}", t=8.0 + i), decode_step_s=0.015), now=8.0 + i)
    assert lt._decode_fit.estimate(min_spread_tokens=0.01) is None
    step = lt.decode_step()
    assert np.allclose(step[:3], 0.015)  # the kept line at a full context, not 5 x 0.015


def test_remote_router_load_is_counted_and_forgotten() -> None:
    lt = tracker()
    ev = RouterLoadEvent(
        router_id="r2",
        instance_id="w2",
        request_id="x",
        kind="route",
        timestamp=0.0,
        prefill_tokens=500,
        kv_tokens=500,
    )
    lt.apply_remote(ev, 2, now=0.0)
    lt.apply_remote(ev, 2, now=0.0)  # duplicate delivery counts once
    assert lt.queued_prefill()[2] == 500 and lt.inflight[2] == 1
    lt.apply_remote(
        RouterLoadEvent(
            router_id="r1", instance_id="w2", request_id="y", kind="route", timestamp=0.0, prefill_tokens=7
        ),
        2,
        now=0.0,
    )
    assert lt.inflight[2] == 1  # our own echo is ignored
    lt.forget_router("r2")
    assert lt.queued_prefill()[2] == 0 and lt.inflight[2] == 0
    assert lt.outbox == []  # remote work is never re-shared


# ---- property: the vectors kept slot by slot equal a rebuild from scratch ----
event = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 400), st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, 3)),
    st.tuples(st.just("route"), st.integers(0, 3), st.integers(0, 9), st.integers(1, 3000)),
    st.tuples(st.just("first"), st.integers(0, 9)),
    st.tuples(st.just("finish"), st.integers(0, 9)),
    st.tuples(
        st.just("report"),
        st.integers(0, 3),
        st.integers(0, 400),  # blocks used
        st.integers(0, 9000),  # queued prefill / tokens computed
        st.integers(0, 6),  # waiting
        st.sampled_from([0.0, 0.004, 0.02, 0.05]),  # decode step
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(event, max_size=60), st.sampled_from([0, 3]))
def test_kept_vectors_equal_a_rebuild_after_any_events(events, max_inflight) -> None:
    lt = LoadTracker("r1", capacity=2, busy_kv_usage=0.9, busy_kv_footprint=1.5, max_inflight=max_inflight)
    registered: set[int] = set()
    limits: dict[int, float] = {}
    last_fit: dict[int, tuple[float, float]] = {}
    fits: dict[int, StepTimeFit] = {}
    decode_fit = StepTimeFit(decay=0.99)
    t = 0.0
    for ev in events:
        t += 1.0
        kind, *args = ev
        if kind == "add":
            slot, blocks, limit = args
            lt.add_worker(slot, kv_blocks_total=blocks, block_size=16, queue_limit=limit)
            registered.add(slot)
            limits[slot] = limit or np.inf
            last_fit.pop(slot, None)
            fits[slot] = StepTimeFit()
        elif kind == "remove" and args[0] in registered:
            lt.remove_worker(args[0])
            registered.discard(args[0])
            limits.pop(args[0], None)
            last_fit.pop(args[0], None)
        elif kind == "route" and args[0] in registered:
            slot, rid, tokens = args
            lt.on_route(f"q{rid}", slot, f"w{slot}", prefill_tokens=tokens, kv_tokens=tokens + 100, now=t)
        elif kind == "first":
            lt.on_first_token(f"q{args[0]}")
        elif kind == "finish":
            lt.on_finish(f"q{args[0]}")
        elif kind == "report" and args[0] in registered:
            slot, used, tokens, waiting, decode = args
            rep = LoadReport(
                instance_id=f"w{slot}",
                timestamp=t,
                num_running=2,
                num_waiting=waiting,
                kv_blocks_used=used,
                kv_blocks_total=400,
                queued_prefill_tokens=tokens,
                step_time_s=0.01 + tokens * 2e-5 + (t % 3) * 1e-3,
                tokens_computed=tokens,
                decode_step_s=decode,
            )
            if decode > 0 and lt.inv_kv_tokens[slot]:
                decode_fit.add(lt.context_usage(slot), decode)
            lt.apply_report(slot, rep, now=t)
            if tokens > 2:
                fits[slot].add(tokens, rep.step_time_s)
                est = fits[slot].estimate()
                if est is not None:
                    last_fit[slot] = est
        lt.check_derived()
        # the busy mark as the router defined it before it was kept slot by slot
        busy = lt.kv_used_frac >= 0.9
        busy |= np.maximum(lt.kv_used_frac, lt.dispatched_kv * lt.inv_kv_tokens) >= 1.5
        if max_inflight:
            busy |= np.maximum(lt.inflight, lt.reported_running) >= max_inflight
        for slot, limit in limits.items():
            busy[slot] |= lt.reported_waiting[slot] + lt.fresh_count[slot] > limit
        assert (lt.busy_mask() == busy).all() and lt.num_busy == int(busy.sum())
        # speed lines: own fit, else the fleet's median, else 1 / tps (registered slots)
        overhead, per_token = lt.speeds()
        want_o = np.full(len(lt.inflight), 0.02)
        want_p = 1.0 / lt.prefill_tps
        if last_fit:
            a, b = np.asarray(list(last_fit.values())).T
            want_o[:] = np.median(a)
            if len(last_fit) < len(registered):
                want_p = np.full(len(lt.inflight), np.median(b))
            for slot, (fa, fb) in last_fit.items():
                want_o[slot], want_p[slot] = fa, fb
        for slot in registered:
            assert overhead[slot] == want_o[slot] and per_token[slot] == want_p[slot]
        # decode step: the fleet line, else the fastest measured step grown by the prior
        line = decode_fit.estimate(min_spread_tokens=0.01)
        context = np.minimum(lt.dispatched_kv * lt.inv_kv_tokens, MAX_DECODE_CONTEXT)
        if line is None:
            measured = lt.decode_measured
            base = lt.decode_step_s[measured].min() if measured.any() else 0.02
            want = base * (1.0 + 4.0 * context)
        else:
            want = line[0] + line[1] * context
        got = lt.decode_step()
        for slot in registered:
            assert got[slot] == want[slot]


# ---- the compiled accounting (csrc/account.c) keeps the vectors the Python does, to the bit ----
@pytest.mark.skipif(native.load() is None, reason="no C compiler: the compiled accounting is not built here")
@settings(max_examples=150, deadline=None)
@given(st.lists(event, max_size=60), st.sampled_from([0, 3]), st.sampled_from([0.0, 5.0]))
def test_the_compiled_accounting_keeps_every_vector_as_the_python(events, max_inflight, lag) -> None:
    kw = {"busy_kv_usage": 0.9, "busy_kv_footprint": 1.5, "max_inflight": max_inflight, "report_lag_s": lag}
    compiled, plain = LoadTracker("r1", capacity=2, **kw), LoadTracker("r1", capacity=2, compiled=False, **kw)
    assert compiled._account is not None and plain._account is None
    t = 0.0
    registered: set[int] = set()
    for ev in events:
        t += 1.0
        kind, *args = ev
        if kind in ("route", "report") and args[0] not in registered:
            continue  # a slot with no worker
        if kind == "add":
            registered.add(args[0])
        elif kind == "remove":
            registered.discard(args[0])
        for lt in (compiled, plain):
            if kind == "add":
                lt.add_worker(args[0], kv_blocks_total=args[1], block_size=16, queue_limit=args[2])
            elif kind == "remove":
                lt.remove_worker(args[0])
            elif kind == "route":
                slot, rid, tokens = args
                lt.on_route(f"q{rid}", slot, f"w{slot}", prefill_tokens=tokens, kv_tokens=tokens + 100, now=t)
                lt.apply_remote(
                    RouterLoadEvent(
                        router_id="r2", instance_id="w", request_id=f"q{rid}", kind="route", timestamp=t,
                        prefill_tokens=tokens // 3, kv_tokens=tokens,
                    ),
                    slot,
                    now=t,
                )  # fmt: skip
            elif kind in ("first", "finish"):
                (lt.on_first_token if kind == "first" else lt.on_finish)(f"q{args[0]}")
                ev_kind = "first_token" if kind == "first" else "finish"
                remote = RouterLoadEvent(
                    router_id="r2", instance_id="w", request_id=f"q{args[0]}", kind=ev_kind, timestamp=t
                )
                lt.apply_remote(remote, None, now=t)
            elif kind == "report":
                slot, used, tokens, waiting, decode = args
                tier = TierStats(tier="host", blocks=1, capacity=9, loads=tokens % 5, load_s=tokens * 1e-7)
                rep = LoadReport(
                    instance_id=f"w{slot}", timestamp=t, num_running=2, num_waiting=waiting, kv_blocks_used=used,
                    kv_blocks_total=400, queued_prefill_tokens=tokens, step_time_s=0.01 + tokens * 2e-5,
                    tokens_computed=tokens, decode_step_s=decode, prefill_tokens_per_s=float(tokens % 3) * 1e3,
                    kv_tiers=(tier,) if tokens % 2 else (),
                )  # fmt: skip
                lt.apply_report(slot, rep, now=t)
                older = replace(rep, timestamp=t - 0.5, queued_prefill_tokens=1)
                lt.apply_report(slot, older, now=t)  # ignored
        compiled.check_derived()
        plain.check_derived()
        assert compiled.num_busy == plain.num_busy
        for name in (*ACCOUNT_VECTORS, *(v[0] for v in _VECTORS)):
            assert getattr(compiled, name).tobytes() == getattr(plain, name).tobytes(), name
        for got, want in zip(compiled.speeds(), plain.speeds(), strict=True):
            assert got.tobytes() == want.tobytes()
        assert compiled.decode_step().tobytes() == plain.decode_step().tobytes()


@pytest.mark.skipif(native.load() is None, reason="no C compiler: the compiled accounting is not built here")
def test_the_compiled_report_refuses_malformed_arguments_by_name() -> None:
    lt = LoadTracker("r1", capacity=2)
    report_figures = native.load().report  # type: ignore[union-attr]
    vectors, limits = lt._account_vectors, lt._limits
    with pytest.raises(TypeError, match="report: figures must be a tuple of 4"):
        report_figures(vectors, 0, (1.0, 2.0, 0.0), limits)
    with pytest.raises(TypeError, match="report: vectors must be a tuple"):
        report_figures(vectors[:-1], 0, (1.0, 2.0, 0.0, None), limits)
    with pytest.raises(TypeError, match="report: vector 0 must be a contiguous float64 vector"):
        report_figures(vectors, 5, (1.0, 2.0, 0.0, None), limits)
    with pytest.raises(ValueError, match="report: slot -1 out of range"):
        report_figures(vectors, -1, (1.0, 2.0, 0.0, None), limits)
    assert report_figures(vectors, 1, (7, 3, 1, None), limits) == 0
    assert lt.queued_prefill()[1] == 7 and lt.queue_depth()[1] == 1 and lt.busy()[1] == 3
