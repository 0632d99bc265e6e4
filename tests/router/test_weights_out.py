"""Workers whose model offloaded its weights while idle (``LoadReport.weights_load_s``): the
router prices the wait for them, keeps traffic on warm workers until their queues cost more,
and wakes an offloaded one ahead of a request when no warm worker is free."""

from __future__ import annotations

import numpy as np
import pytest

from interlock.router import LoadTracker, Router, RouterConfig
from interlock.router.kv_decide import KvRequest, ReferenceDecider
from interlock.router.route_kernel import CompiledDecider
from tests.factories import load_report
from tests.router.test_model_router import PROMPT, Clock, info, make, route


def _out(r: Router, wid: str, wait_s: float, t: float = 1.0, **fields: object) -> None:
    r.apply_load(load_report(wid, timestamp=t, kv_blocks_total=100_000, weights_load_s=wait_s, **fields))


def test_the_tracker_counts_workers_whose_weights_are_out() -> None:
    load = LoadTracker()
    for slot in range(3):
        load.add_worker(slot, kv_blocks_total=64)
    assert load.weights_waits() is None
    load.apply_report(1, load_report("w1", timestamp=1.0, weights_load_s=0.7), now=1.0)
    load.apply_report(2, load_report("w2", timestamp=1.0, weights_load_s=0.4), now=1.0)
    waits = load.weights_waits()
    assert waits is not None and waits[:3].tolist() == [0.0, 0.7, 0.4] and load.num_weights_out == 2
    load.apply_report(1, load_report("w1", timestamp=2.0), now=2.0)  # back in
    load.remove_worker(2)
    assert load.num_weights_out == 0 and load.weights_waits() is None
    assert not load.weights_wait_s.any()


def test_a_warm_worker_keeps_the_traffic_until_its_queue_costs_more_than_the_load() -> None:
    r, _ = make(2)
    _out(r, "w1", 2.0)
    assert route(r, "a", PROMPT).worker_id == "w0"
    # w0 reports a long prefill queue: seconds of work, more than w1's 2 s load
    r.apply_load(load_report("w0", timestamp=2.0, kv_blocks_total=100_000, queued_prefill_tokens=10**6))
    assert route(r, "b", PROMPT).worker_id == "w1"


def test_the_compiled_decider_leaves_such_decisions_to_the_reference() -> None:
    r, _ = make(3)
    decider = r.decider
    if not isinstance(decider, CompiledDecider):
        pytest.skip("no compiled decider here (no C compiler): the reference decides everything")
    _out(r, "w0", 0.5)
    _out(r, "w2", 0.05)
    req = KvRequest(
        hashes=r.block_hashes(PROMPT), prompt_tokens=400, max_tokens=16, mask=np.ones(3, dtype=bool), whole=True,
        weight=None, rotation=0, fleet=3,
    )  # fmt: skip
    reference = ReferenceDecider(r.indexer, r.load, decider.params, decider.k, np.random.default_rng(0))
    got, want = decider.decide(req), reference.decide(req)
    assert got.slot == want.slot == 1
    assert np.array_equal(got.costs, want.costs)
    assert abs(want.costs[0] - want.costs[1] - 0.5) < 1e-9  # the same worker but for the wait


def test_a_request_wakes_the_quickest_offloaded_worker_when_no_warm_one_is_free() -> None:
    clock = Clock()
    r = Router(RouterConfig(block_size=4, seed=0, max_inflight_per_worker=1), clock=clock)
    for i in range(3):
        r.add_worker(info(f"w{i}"))
    assert r.weights_to_wake() is None  # nothing out
    _out(r, "w1", 3.0)
    _out(r, "w2", 1.5)
    assert r.weights_to_wake() is None  # w0 is warm and free
    route(r, "busy", PROMPT)  # w0 now has its one request in flight: busy
    assert r.weights_to_wake() == "w2"  # the quicker of the two
    # w2 is priced as warm now (its weights are on their way): the request goes there
    assert r.load.weights_wait_s[r._slot_of("w2")] == 0.0  # type: ignore[attr-defined]
    assert r.weights_to_wake() is None  # a warm, free worker again: nothing more to wake
    assert route(r, "next", [t + 1000 for t in PROMPT]).worker_id == "w2"


def test_a_pool_with_every_worker_offloaded_wakes_one() -> None:
    r, _ = make(2)
    _out(r, "w0", 0.9)
    _out(r, "w1", 0.9)
    woken = r.weights_to_wake()
    assert woken in ("w0", "w1")
    assert route(r, "a", PROMPT).worker_id == woken


def test_a_report_sent_again_from_before_the_wake_does_not_put_the_weights_back_out() -> None:
    # An idle worker sends its last report again and again; while the prefetch loads, that
    # report still says the weights are out. Only a report made after the wake may say so.
    r, _ = make(2)
    _out(r, "w0", 0.9, t=5.0)
    _out(r, "w1", 0.9, t=5.0)
    woken = r.weights_to_wake()
    assert woken is not None
    slot = r._slot_of(woken)  # type: ignore[attr-defined]
    _out(r, woken, 0.9, t=5.0)  # the same report, sent again
    assert r.load.weights_wait_s[slot] == 0.0 and r.load.num_weights_out == 1
    assert route(r, "a", PROMPT).worker_id == woken
    _out(r, woken, 0.0, t=6.0)  # loaded
    _out(r, woken, 0.4, t=9.0)  # and offloaded again, later
    assert r.load.weights_wait_s[slot] == 0.4 and r.load.num_weights_out == 2


def test_a_failed_prefetch_prices_the_wait_again() -> None:
    r, _ = make(2)
    _out(r, "w0", 0.9)
    _out(r, "w1", 0.3)
    assert r.weights_to_wake() == "w1"
    assert r.load.num_weights_out == 1
    r.wake_failed("w1")
    assert r.load.weights_wait_s[1] == 0.3 and r.load.num_weights_out == 2
    r.wake_failed("w1")  # once is enough; a worker never woken is left alone
    r.wake_failed("w0")
    assert r.load.weights_wait_s.tolist()[:2] == [0.9, 0.3]
