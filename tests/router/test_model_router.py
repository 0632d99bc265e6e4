from __future__ import annotations

import numpy as np
import pytest

import interlock.router as router_pkg
from interlock.errors import ConfigError, InvalidRequest, NoWorkers, Overloaded
from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch, LoadReport
from interlock.router import Decision, Pending, RequestMeta, Router, RouterConfig
from interlock.router.cost import CostParams
from tests.factories import load_report

BS = 4


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(n: int = 4, events: bool = True, **cfg) -> tuple[Router, Clock]:
    clock = Clock()
    r = Router(RouterConfig(block_size=BS, seed=0, **cfg), clock=clock)
    for i in range(n):
        r.add_worker(info(f"w{i}", events))
    for wid in r.needs_resync():
        r.apply_events(KVEventBatch(instance_id=wid, seq=-1, timestamp=0.0, events=(), snapshot=True))
    return r, clock


def info(wid: str, events: bool = True, role: str = "both", queue_depth_threshold: int = 0) -> InstanceInfo:
    return InstanceInfo(
        instance_id=wid,
        endpoint="ns.worker.generate",
        model="m",
        block_size=BS,
        kv_blocks_total=100_000,
        publishes_kv_events=events,
        role=role,
        queue_depth_threshold=queue_depth_threshold,
    )


def cache(r: Router, wid: str, tokens: list[int], seq: int = 0) -> None:
    r.apply_events(
        KVEventBatch(
            instance_id=wid,
            seq=seq,
            timestamp=0.0,
            events=(BlockStored(block_hashes=tuple(r.block_hashes(tokens)), parent_block_hash=None),),
        )
    )


def req(rid: str, n: int = 400, **kw) -> RequestMeta:
    return RequestMeta(request_id=rid, prompt_tokens=n, **kw)


def route(r: Router, rid: str, tokens: list[int], **kw) -> Decision:
    d = r.route(req(rid, len(tokens), **kw), token_ids=tokens)
    assert isinstance(d, Decision)
    return d


PROMPT = list(range(400))


def test_public_api_is_pinned() -> None:
    assert sorted(router_pkg.__all__) == sorted(
        [
            "POLICIES",
            "AdmissionQueue",
            "ApplyResult",
            "Candidate",
            "CostParams",
            "Decision",
            "KvIndexer",
            "LoadTracker",
            "Pending",
            "RequestMeta",
            "Router",
            "RouterConfig",
            "RouterMetrics",
        ]
    )


def test_kv_goes_where_the_prefix_is_and_explains_itself() -> None:
    r, _ = make()
    cache(r, "w2", PROMPT[:320])
    d = route(r, "a", PROMPT)
    assert d.worker_id == "w2" and d.reason == "kv" and d.overlap_blocks == 80
    assert d.cached_tokens == 320 and d.candidates[0].worker_id == "w2"
    assert d.header().startswith("worker=w2; reason=kv; overlap=80; cost=")
    assert "route a -> w2" in d.log_line() and "w2:" in d.log_line()
    assert r.metrics.decisions == 1 and r.metrics.hit_rate == 0.8


def test_a_burst_spreads_before_any_load_report() -> None:
    r, _ = make(4, share_load=False)
    picks = [route(r, f"r{i}", [i] * 400).worker_id for i in range(4)]
    assert sorted(picks) == ["w0", "w1", "w2", "w3"]
    assert r.drain_shared() == []  # a lone router keeps no events for others


def test_a_cold_burst_spreads_after_the_first_worker_reports_its_decode_speed() -> None:
    # w0 has decoded (1 ms steps), the others never have: they must not be priced at a default
    # decode step (once 20 ms: 300 tokens made every cold worker look 1.2 s away)
    r, clock = make(4, share_load=False)
    clock.t = 1.0
    r.apply_load(
        LoadReport(
            instance_id="w0",
            timestamp=1.0,
            num_running=0,
            num_waiting=0,
            kv_blocks_used=0,
            kv_blocks_total=100_000,
            queued_prefill_tokens=0,
            step_time_s=0.001,
            tokens_computed=1,
            decode_step_s=0.001,
        )
    )
    picks = [route(r, f"r{i}", [i] * 400, max_tokens=300).worker_id for i in range(8)]
    assert sorted(set(picks)) == ["w0", "w1", "w2", "w3"]


def test_a_cached_worker_is_left_once_its_queue_costs_more_than_the_hit() -> None:
    r, _ = make(2)
    cache(r, "w0", PROMPT[:320])
    picks = [route(r, f"r{i}", PROMPT[:320] + [1000 + i] * 80).worker_id for i in range(30)]
    assert picks[:3] == ["w0"] * 3 and "w1" in picks, picks
    r.on_first_token("r0")
    r.on_finish("r0")
    assert r.load.inflight.sum() == 29


def test_unhealthy_and_draining_workers_get_nothing() -> None:
    r, _ = make(3)
    cache(r, "w0", PROMPT)
    r.set_health("w0", False)
    r.apply_load(
        LoadReport(
            instance_id="w1",
            timestamp=1.0,
            num_running=0,
            num_waiting=0,
            kv_blocks_used=0,
            kv_blocks_total=1000,
            queued_prefill_tokens=0,
            step_time_s=0.0,
            tokens_computed=0,
            draining=True,
        )
    )
    assert {route(r, f"r{i}", PROMPT).worker_id for i in range(5)} == {"w2"}
    r.set_health("w2", False)
    with pytest.raises(NoWorkers):
        r.route(req("x"), token_ids=PROMPT)


@pytest.mark.parametrize("policy", ["round-robin", "random", "least-loaded", "power-of-two"])
def test_simple_policies_use_every_worker(policy: str) -> None:
    r, _ = make(4, policy=policy)
    picks = [route(r, f"r{i}", PROMPT).worker_id for i in range(40)]
    assert set(picks) == {"w0", "w1", "w2", "w3"}
    assert {d.reason for d in [route(r, "z", PROMPT)]} == {policy}


def test_least_loaded_follows_in_flight_counts() -> None:
    r, _ = make(3, policy="least-loaded")
    first = [route(r, f"r{i}", PROMPT).worker_id for i in range(3)]
    assert sorted(first) == ["w0", "w1", "w2"]
    r.on_finish("r1")
    assert route(r, "next", PROMPT).worker_id == first[1]


def test_direct_pins_a_worker() -> None:
    r, _ = make(3)
    cache(r, "w0", PROMPT)
    d = route(r, "a", PROMPT, worker_id="w2")
    assert d.worker_id == "w2" and d.reason == "direct"
    with pytest.raises(InvalidRequest, match="no worker 'nope' serves this model") as unknown:
        r.route(req("b", worker_id="nope"), token_ids=PROMPT)  # never seen: the client's mistake
    assert unknown.value.param == "x-worker-id"
    r.remove_worker("w1")
    with pytest.raises(NoWorkers):  # away (restarting, say): retry later
        r.route(req("c", worker_id="w1"), token_ids=PROMPT)


def test_session_affinity_sticks_until_ttl() -> None:
    r, clock = make(3, session_ttl_s=60.0)
    first = route(r, "a", [7] * 400, session_id="s").worker_id
    cache(r, "w0" if first != "w0" else "w1", PROMPT)  # a better cache elsewhere
    d = route(r, "b", PROMPT, session_id="s")
    assert d.worker_id == first and d.reason == "session"
    clock.t = 200.0
    assert route(r, "c", PROMPT, session_id="s").reason == "kv"


def test_route_key_keeps_a_subset_and_spills_over() -> None:
    r, _ = make(6, route_key_subset=2, spill_factor=1.5)
    picks = [route(r, f"r{i}", [i] * 400, route_key="team-a") for i in range(4)]
    subset = {d.worker_id for d in picks}
    assert len(subset) == 2 and {d.reason for d in picks} == {"route_key"}
    spilled = [route(r, f"s{i}", [100 + i] * 400, route_key="team-a") for i in range(20)]
    assert any(d.reason == "route_key-spill" for d in spilled)
    assert {d.worker_id for d in spilled} - subset


def test_queue_when_all_busy_then_dispatch_reject_past_capacity() -> None:
    r, _ = make(2, max_inflight_per_worker=1, queue_capacity=2)
    route(r, "a", PROMPT)
    route(r, "b", list(range(1000, 1400)))  # another prompt (this one's would wait for "a"'s worker)
    p = r.route(req("c"), token_ids=PROMPT)
    assert isinstance(p, Pending)
    r.route(req("d", priority=-3), token_ids=PROMPT)  # lower value: served first
    with pytest.raises(Overloaded):
        r.route(req("e"), token_ids=PROMPT)
    assert r.metrics.rejected == 1
    assert r.metrics.queued == 2 and r.metrics.queued_by_role == {"any": 2}  # "e" never waited
    probe = r.route(req("f"), token_ids=PROMPT, may_wait=False)  # nothing free: not queued
    assert isinstance(probe, Pending) and len(r.queue) == 2 and r.metrics.queued == 2
    r.on_finish("a")
    out = r.dispatch_queued()
    assert [d.request_id for d in out] == ["d"] and out[0].reason == "kv+queued"
    r.cancel("c")
    r.on_finish("b")
    assert r.dispatch_queued() == []


def test_a_queued_request_is_not_held_behind_one_whose_role_is_all_busy() -> None:
    """A disaggregated request holding the prefill worker waits for the decode worker behind a
    request waiting for that prefill worker: once the decode worker frees, it goes (before,
    the busy head blocked the queue: both waited for each other)."""
    r, _ = make(0, max_inflight_per_worker=1)
    r.add_worker(info("p", role="prefill"))
    r.add_worker(info("d", role="decode"))
    route(r, "a#prefill", PROMPT, role="prefill")
    route(r, "b", PROMPT, role="decode")
    assert isinstance(r.route(req("c#prefill", role="prefill"), token_ids=PROMPT), Pending)
    assert isinstance(r.route(req("a", role="decode"), token_ids=PROMPT), Pending)
    assert r.queue.roles() == {"prefill", "decode"}
    assert r.metrics.queued_by_role == {"prefill": 1, "decode": 1}
    r.on_finish("b")
    assert [d.request_id for d in r.dispatch_queued()] == ["a"]
    assert r.queue.roles() == {"prefill"} and len(r.queue) == 1
    r.on_finish("a#prefill")
    assert [d.request_id for d in r.dispatch_queued()] == ["c#prefill"]
    assert r.queue.roles() == set() and len(r.queue) == 0


def test_requests_queued_for_a_role_whose_last_worker_left_are_taken_out() -> None:
    """Taken out (the glue fails them with NoWorkers at once) when no registered worker can
    take them; a worker that is only unhealthy, blocked or draining keeps its waiters."""
    r, _ = make(0, max_inflight_per_worker=1)
    r.add_worker(info("p", role="prefill"))
    r.add_worker(info("d", role="decode"))
    route(r, "a#prefill", PROMPT, role="prefill")
    route(r, "b", PROMPT, role="decode")
    for rid, role in (("c#prefill", "prefill"), ("x", "decode"), ("y", None)):
        assert isinstance(r.route(req(rid, role=role), token_ids=PROMPT), Pending)
    r.set_health("p", False)
    r.set_blocked("p", True)
    assert r.take_stranded() == [] and len(r.queue) == 3
    r.remove_worker("p")
    assert [m.request_id for m in r.take_stranded()] == ["c#prefill"]
    assert r.queue.roles() == {"decode", None} and r.take_stranded() == []
    r.add_worker(info("b", role="both"))
    r.remove_worker("d")
    assert r.take_stranded() == []  # a "both" worker takes either
    r.remove_worker("b")
    assert sorted(m.request_id for m in r.take_stranded()) == ["x", "y"] and len(r.queue) == 0


def usage(wid: str, frac: float, t: float) -> LoadReport:
    return LoadReport(
        instance_id=wid,
        timestamp=t,
        num_running=4,
        num_waiting=0,
        kv_blocks_used=int(frac * 100_000),
        kv_blocks_total=100_000,
        queued_prefill_tokens=0,
        step_time_s=0.0,
        tokens_computed=0,
    )


LONG = list(range(2000))


def test_a_queued_request_waits_for_the_busy_worker_with_its_prefix() -> None:
    r, clock = make(2, share_load=False)
    cache(r, "w0", LONG)
    r.apply_load(usage("w0", 0.99, 1.0))
    r.apply_load(usage("w1", 0.99, 1.0))
    assert isinstance(r.route(req("a", 2000), token_ids=LONG), Pending)  # both full
    r.apply_load(usage("w1", 0.10, 2.0))  # w1 has room, but recomputing 2,000 tokens costs more
    assert r.dispatch_queued() == []
    # a request that w1 suits goes past it
    assert route(r, "b", [7] * 400).worker_id == "w1"
    r.apply_load(usage("w0", 0.50, 3.0))
    [d] = r.dispatch_queued()
    assert (d.request_id, d.worker_id, d.reason) == ("a", "w0", "kv+queued")


def test_a_queued_request_waits_no_longer_than_its_hit_saves() -> None:
    r, clock = make(2, share_load=False)
    cache(r, "w0", LONG)
    r.apply_load(usage("w0", 0.99, 1.0))
    assert isinstance(r.route(req("a", 2000), token_ids=LONG), Pending)  # w0 is worth a wait
    assert r.dispatch_queued() == []
    clock.t = 5.0  # waited longer than recomputing on w1 takes
    [d] = r.dispatch_queued()
    assert d.worker_id == "w1" and d.reason == "kv+queued+gave_up"  # counted apart


def _tired_a_and_fresh_b(b_priority: int = 0) -> Router:
    """Both workers full (one request each); queued: "a" (w0's prefix), waited past its
    give-up point, then "b" (w1's prefix), just come; w1 has just finished its request."""
    r, clock = make(2, share_load=False, max_inflight_per_worker=1)
    other = list(range(5000, 7000))
    cache(r, "w0", LONG)
    cache(r, "w1", other, seq=1)
    assert route(r, "x", LONG).worker_id == "w0" and route(r, "y", other).worker_id == "w1"
    assert isinstance(r.route(req("a", 2000), token_ids=LONG), Pending)
    clock.t = 5.0  # "a" has waited longer than recomputing its prompt elsewhere takes
    assert isinstance(r.route(req("b", 2000, priority=b_priority), token_ids=other), Pending)
    r.on_finish("y")
    return r


def test_an_opened_worker_goes_first_to_a_queued_request_it_suits() -> None:
    # w1 takes "b", not "a": a tired head that went anywhere would cost "b" its hit too (in one
    # pass, overload drove the hit ratio down to round-robin's).
    r = _tired_a_and_fresh_b()
    assert [(d.request_id, d.worker_id) for d in r.dispatch_queued()] == [("b", "w1")]
    r.on_finish("x")
    assert [(d.request_id, d.worker_id) for d in r.dispatch_queued()] == [("a", "w0")]


def test_the_first_pass_keeps_to_the_most_important_requests_waiting() -> None:
    # "b" less important than "a": it does not go first, and the tired "a" takes w1.
    r = _tired_a_and_fresh_b(b_priority=1)
    assert [(d.request_id, d.worker_id) for d in r.dispatch_queued()] == [("a", "w1")]


def test_max_queue_wait_refuses_what_would_wait_too_long() -> None:
    r, clock = make(1, share_load=False, max_inflight_per_worker=1, max_queue_wait_s=2.0)
    for i in range(3):  # one dispatch a second
        clock.t = float(i)
        route(r, f"d{i}", [i] * 40)
        r.on_finish(f"d{i}")
    route(r, "busy", [9] * 40)  # 4 dispatches in 2 s: one every 2/3 s
    for i in range(4):  # the 4th waits behind 3: 2 s
        assert isinstance(r.route(req(f"q{i}"), token_ids=PROMPT), Pending)
    with pytest.raises(Overloaded, match="expected wait"):
        r.route(req("q4"), token_ids=PROMPT)
    with pytest.raises(ConfigError):
        RouterConfig(max_queue_wait_s=-1)


def waiting(wid: str, n: int, t: float) -> LoadReport:
    return LoadReport(
        instance_id=wid,
        timestamp=t,
        num_running=4,
        num_waiting=n,
        kv_blocks_used=0,
        kv_blocks_total=100_000,
        queued_prefill_tokens=0,
        step_time_s=0.0,
        tokens_computed=0,
    )


@pytest.mark.parametrize("threshold", [0, 2])
def test_queue_depth_threshold_marks_a_worker_busy(threshold: int) -> None:
    r = Router(RouterConfig(block_size=BS, seed=0, policy="round-robin"), clock=Clock())
    for wid in ("w0", "w1"):
        r.add_worker(info(wid, queue_depth_threshold=threshold))
    r.apply_load(waiting("w0", 3, 1.0))
    r.apply_load(waiting("w1", 0, 1.0))
    picks = [r.route(req(f"a{i}"), token_ids=PROMPT) for i in range(4)]
    if not threshold:  # the queue depth changes nothing
        assert sorted(d.worker_id for d in picks if isinstance(d, Decision)) == ["w0", "w0", "w1", "w1"]
        return
    # w0 waits on 3 > 2; w1 takes requests until its queue (0 reported + sent since) passes 2
    assert [d.worker_id if isinstance(d, Decision) else "queued" for d in picks] == [
        "w1",
        "w1",
        "w1",
        "queued",
    ]
    r.apply_load(waiting("w0", 1, 2.0))
    assert [d.worker_id for d in r.dispatch_queued()] == ["w0"]


def test_workers_without_events_are_predicted_from_routing() -> None:
    r, _ = make(3, events=False)
    assert r.needs_resync() == []
    first = route(r, "a", PROMPT).worker_id
    r.on_first_token("a")
    r.on_finish("a")
    d = route(r, "b", PROMPT)
    assert d.worker_id == first and d.overlap_blocks == 100


def test_two_routers_share_dispatch_load() -> None:
    r1, _ = make(2)
    r2 = Router(RouterConfig(block_size=BS), router_id="r2")
    for i in range(2):
        r2.add_worker(info(f"w{i}"))
    d1 = route(r1, "a", [1] * 4000)
    for ev in r1.drain_shared():
        r2.apply_remote_load(ev)
    d2 = r2.route(req("b", 4000), token_ids=[2] * 4000)
    assert d2.worker_id != d1.worker_id


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        RouterConfig(policy="fastest")
    r, _ = make(1)
    with pytest.raises(ConfigError):
        r.add_worker(InstanceInfo(instance_id="odd", endpoint="e", model="m", block_size=16))


def test_removed_worker_takes_its_blocks_and_sessions() -> None:
    r, _ = make(2)
    cache(r, "w0", PROMPT)
    route(r, "a", PROMPT, session_id="s")
    r.remove_worker("w0")
    d = route(r, "b", PROMPT, session_id="s")
    assert d.worker_id == "w1" and d.overlap_blocks == 0


@pytest.mark.parametrize(("over", "pick"), [("decoding", "w0"), ("inflight", "w1")])
def test_the_stall_counts_queued_requests_with_stall_over_inflight(over: str, pick: str) -> None:
    # w0 has three requests queued (none past its first token), w1 one decoding: a 10-chunk
    # prompt stalls nobody on w0 counted by "decoding", but the three once they decode, and
    # "inflight" counts them
    r, _ = make(2, share_load=False, cost=CostParams(chunk_tokens=400, stall_over=over))
    for i in range(3):
        route(r, f"q{i}", [7], worker_id="w0")
    route(r, "d0", [8], worker_id="w1")
    r.on_first_token("d0")
    assert route(r, "long", [9] * 4000).worker_id == pick


def test_the_eligible_masks_kept_up_to_date_equal_masks_built_afresh() -> None:
    """Joins, leaves, health, breakers and drains change one slot of the cached masks each; after
    every step the masks equal ones built from every worker."""
    import random

    rng = random.Random(5)
    r = Router(RouterConfig(seed=0))
    live: list[str] = []
    for step in range(600):
        op = rng.random()
        if op < 0.35 or not live:
            wid = f"w{step}"
            role = rng.choice(("both", "prefill", "decode"))
            r.add_worker(InstanceInfo(instance_id=wid, endpoint="e", model="m", role=role))
            live.append(wid)
        elif op < 0.5:
            r.remove_worker(live.pop(rng.randrange(len(live))))
        elif op < 0.65:
            r.set_health(rng.choice(live), rng.random() < 0.5)
        elif op < 0.8:
            r.set_blocked(rng.choice(live), rng.random() < 0.5)
        else:
            wid = rng.choice(live)
            r.apply_load(load_report(wid, timestamp=float(step), draining=rng.random() < 0.3))
        for role in (None, "prefill", "decode"):
            kept = r._eligible(role).copy()
            whole = r._is_whole(r._eligible(role))
            r._eligible_cache.pop(role)
            fresh = r._eligible(role)
            assert np.array_equal(kept, fresh), (step, role)
            assert whole == (len(fresh) > 0 and bool(fresh.all())), (step, role)


def test_a_long_prompt_handed_over_again_as_the_same_tuple_is_not_hashed_again() -> None:
    from interlock.router.model_router import HASH_MEMO_TOKENS

    router = Router(RouterConfig(block_size=16))
    ids = tuple(range(HASH_MEMO_TOKENS + 40))
    first = router.block_hashes(ids)
    assert router.block_hashes(ids) is first
    equal = list(ids)  # equal but not the same object: hashed again, to the same values
    assert router.block_hashes(equal) == first and router.block_hashes(equal) is not first
    short = tuple(range(64))
    assert router.block_hashes(short) is not router.block_hashes(short)
