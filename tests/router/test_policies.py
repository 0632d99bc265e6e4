import numpy as np

from interlock.router.policies import SessionTable, pick_simple, rendezvous_subset, should_spill


def test_session_table_ttl_refresh_and_forget() -> None:
    t = SessionTable(ttl_s=10.0, max_sessions=2)
    t.put("s1", "w1", now=0.0)
    assert t.get("s1", 5.0) == "w1"
    t.put("s1", "w1", now=5.0)
    assert t.get("s1", 14.0) == "w1" and t.get("s1", 15.0) is None
    t.put("a", "w1", 20.0)
    t.put("b", "w2", 20.0)
    t.put("c", "w2", 20.0)  # full: the oldest goes
    assert t.get("a", 21.0) is None and len(t) == 2
    t.forget_worker("w2")
    assert len(t) == 0


def test_rendezvous_subset_is_stable_when_other_workers_change() -> None:
    ids = [f"w{i}" for i in range(10)]
    sub = rendezvous_subset("business-line-7", ids, 3)
    assert len(sub) == 3 and sub == rendezvous_subset("business-line-7", list(reversed(ids)), 3)
    others = [w for w in ids if w not in sub]
    assert rendezvous_subset("business-line-7", sub + others[:2], 3) == sub


def test_spill_only_when_the_whole_subset_is_loaded() -> None:
    all_busy = np.array([10, 0, 0, 0])
    assert should_spill(np.array([10]), all_busy, 1.5)
    assert not should_spill(np.array([10, 0]), all_busy, 1.5)
    assert not should_spill(np.array([0]), np.zeros(4), 1.5)


def test_simple_policies() -> None:
    rng = np.random.default_rng(0)
    elig = np.array([True, False, True, True])
    busy = np.array([3, 0, 1, 1])
    queued = np.array([0, 0, 50, 10])
    assert [pick_simple("round-robin", elig, busy, queued, rng, r) for r in range(4)] == [0, 2, 3, 0]
    assert pick_simple("least-loaded", elig, busy, queued, rng, 0) == 3
    assert {pick_simple("random", elig, busy, queued, rng, 0) for _ in range(50)} == {0, 2, 3}
    p2 = [pick_simple("power-of-two", elig, busy, queued, rng, 0) for _ in range(50)]
    assert 1 not in p2 and p2.count(0) == 0  # worker 0 always loses its pair
