"""The router service as the planner's load view (in-process runtime, a registered worker)."""

from __future__ import annotations

import msgspec

from interlock.planner.live import RouterServiceView
from interlock.protocol import subjects
from interlock.protocol.routing import Completion
from interlock.router import RequestMeta
from interlock.router.service import RouterService
from interlock.runtime.runtime import Runtime
from tests.factories import load_report
from tests.router.test_service import _run, _settle, info


def test_view_reads_reports_queue_totals_and_sets_weights() -> None:
    async def body(runtime: Runtime, svc: RouterService) -> None:
        view = RouterServiceView(svc)
        await runtime.discovery.register(info("w0"))
        await runtime.discovery.register(info("w1"))
        await _settle(svc, lambda: svc.instance("w1") is not None and "m" in svc.routers)
        rep = load_report(
            "w0",
            num_running=2,
            num_waiting=5,
            kv_blocks_used=32,
            queued_prefill_tokens=100,
            step_time_s=0.01,
            tokens_computed=10,
        )
        await runtime.events.publish(subjects.load("w0"), msgspec.msgpack.encode(rep))
        await _settle(svc, lambda: view.report("w0") is not None)
        assert view.report("w0") == rep and view.report("w1") is None
        router = svc.routers["m"]
        router.route(RequestMeta(request_id="r1", prompt_tokens=64), token_ids=list(range(64)))
        assert view.totals().requests == 0  # a decision is not a request (a leg, a probe, a retry)
        router.metrics.record_request(64, 16)  # the dispatcher's count, once per request
        t = view.totals()
        assert (t.requests, t.prompt_tokens, t.cached_tokens) == (1, 64, 16) and view.queued() == 0
        # one model's view (a serving instance's planner): that model's router only
        assert RouterServiceView(svc, model="m").totals() == t
        other = RouterServiceView(svc, model="other")
        assert other.totals().requests == 0 and other.queued() == 0
        other.set_weight("w1", 0.5)
        assert router._weights(2) is None
        view.set_weight("w1", 0.5)
        assert router._weights(2) is not None
        # finished requests: each handed over once, counted past what the view saw at start
        m = svc.dispatcher.metrics
        assert view.completions() == []
        c = Completion(1.0, 0.2, 1.0, 11, 64, 0)
        m.complete(c)
        m.complete(c)
        assert view.completions() == [c, c] and view.completions() == []
        # one model's view: that model's finished requests only
        mine, theirs = RouterServiceView(svc, model="m"), RouterServiceView(svc, model="other")
        cm, co = Completion(1.0, 0.2, 1.0, 11, 64, 0, "m"), Completion(1.0, 0.2, 1.0, 11, 64, 0, "other")
        for done in (cm, co, cm):
            m.complete(done)
        assert mine.completions() == [cm, cm] and theirs.completions() == [co]
        assert view.completions() == [cm, co, cm]

    _run(body)
