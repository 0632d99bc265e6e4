from interlock.router.decision import Candidate, Decision, RouterMetrics


def test_rendering_and_metrics() -> None:
    d = Decision(
        "r1",
        "w3",
        "kv",
        overlap_blocks=5,
        prompt_tokens=100,
        block_size=16,
        candidates=(Candidate("w3", 0.012, 5), Candidate("w1", 0.05, 0)),
        decision_s=42e-6,
    )
    assert d.cached_tokens == 80
    assert d.header() == "worker=w3; reason=kv; overlap=5; cost=0.0120"
    assert d.log_line() == (
        "route r1 -> w3 reason=kv overlap=5b cached~80/100tok took=42us best=[w3:0.0120s/5b w1:0.0500s/0b]"
    )
    plain = Decision("r2", "w1", "round-robin", overlap_blocks=9, prompt_tokens=100, block_size=16)
    assert plain.cached_tokens == 100 and plain.header() == "worker=w1; reason=round-robin; overlap=9"
    loading = Decision("r3", "w2", "kv", overlap_blocks=0, prompt_tokens=10, block_size=16, kv_loading=7)
    assert loading.header() == "worker=w2; reason=kv; overlap=0; kv_loading=7"
    m = RouterMetrics()
    m.record(d)
    m.record(plain)
    assert m.decisions == 2 and m.by_reason == {"kv": 1, "round-robin": 1}
    assert m.hit_rate == 0.9 and m.mean_decision_s == 21e-6
