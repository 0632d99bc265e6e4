from interlock.sim.synthetic import SharedPrefixSpec, shared_prefix_requests


def test_groups_share_system_prompt_and_sessions_extend_their_history() -> None:
    spec = SharedPrefixSpec(num_requests=30, num_groups=2, system_tokens=256, suffix_tokens=64,
                            output_tokens=32, turns=3, block_size=64, seed=3)
    reqs = shared_prefix_requests(spec)
    assert len(reqs) == 30 and reqs == shared_prefix_requests(spec)  # seeded
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    firsts = {r.block_hashes[:4] for r in reqs}
    assert len(firsts) == 2  # two system prompts
    by_id = {r.request_id: r for r in reqs}
    t0, t1 = by_id["s0t0"], by_id["s0t1"]
    assert t1.session_id == "s0" and t1.prompt_tokens == t0.prompt_tokens + 32 + 64
    assert t1.block_hashes[: len(t0.block_hashes)] == t0.block_hashes
