from __future__ import annotations

from msgspec.structs import replace

from interlock.protocol.events import LoadReport, RouterLoadEvent
from interlock.router.load import DECODE_CONTEXT_SLOPE, DEFAULT_PREFILL_TPS, LoadTracker


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
