from interlock.mooncake import load_mooncake, write_mooncake
from interlock.sim.synthetic import (
    AgentSpec,
    RagSpec,
    SharedPrefixSpec,
    agent_records,
    rag_records,
    shared_prefix_requests,
)


def test_groups_share_system_prompt_and_sessions_extend_their_history() -> None:
    spec = SharedPrefixSpec(
        num_requests=30,
        num_groups=2,
        system_tokens=256,
        suffix_tokens=64,
        output_tokens=32,
        turns=3,
        block_size=64,
        seed=3,
    )
    reqs = shared_prefix_requests(spec)
    assert len(reqs) == 30 and reqs == shared_prefix_requests(spec)  # seeded
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    firsts = {r.block_hashes[:4] for r in reqs}
    assert len(firsts) == 2  # two system prompts
    by_id = {r.request_id: r for r in reqs}
    t0, t1 = by_id["s0t0"], by_id["s0t1"]
    assert t1.session_id == "s0" and t1.prompt_tokens == t0.prompt_tokens + 32 + 64
    assert t1.block_hashes[: len(t0.block_hashes)] == t0.block_hashes


def test_agent_sessions_resend_their_history_within_the_input_limit(tmp_path) -> None:
    spec = AgentSpec(num_sessions=40, num_system_prompts=3, max_input_tokens=12_000, seed=4)
    recs = agent_records(spec)
    assert recs == agent_records(spec)  # seeded
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in zip(recs, recs[1:], strict=False))
    assert all(1024 <= r.input_length <= 12_000 for r in recs)
    assert all(r.input_length == 512 * len(r.hash_ids) for r in recs)
    # every prompt starts with one of the 3 system prompts (2-8 blocks: the first 2 say which)
    assert len({r.hash_ids[:2] for r in recs}) == 3
    # a later turn extends an earlier prompt: some record's ids are a proper prefix of another's
    ids = {r.hash_ids for r in recs}
    assert (
        sum(any(o[: len(r.hash_ids)] == r.hash_ids for o in ids if len(o) > len(r.hash_ids)) for r in recs)
        > len(recs) // 2
    )
    path = tmp_path / "agent.jsonl"
    write_mooncake(recs, path)
    assert load_mooncake(path) == recs


def test_rag_prompts_share_documents_up_to_where_their_retrievals_differ(tmp_path) -> None:
    spec = RagSpec(num_sessions=300, num_documents=50, num_topics=10, seed=5)
    recs = rag_records(spec)
    assert recs == rag_records(spec)  # seeded
    assert all(a.timestamp_ms <= b.timestamp_ms for a, b in zip(recs, recs[1:], strict=False))
    # the question starts a block of its own: the last block is partly filled
    assert all(512 * (len(r.hash_ids) - 1) < r.input_length < 512 * len(r.hash_ids) for r in recs)
    # a document's blocks recur in many prompts, at more than one depth
    depths: dict[int, set[int]] = {}
    for r in recs:
        for i, h in enumerate(r.hash_ids):
            depths.setdefault(h, set()).add(i)
    assert sum(len(d) > 1 for d in depths.values()) > 20
    # shared prefixes are partial: many pairs of first questions share more than the system
    # prompt, but few share their whole context
    firsts = [r.hash_ids[:-1] for r in recs]
    common = [_common(a, b) for a, b in zip(firsts, firsts[1:], strict=False)]
    assert sum(c > 2 for c in common) > len(common) // 10
    # a follow-up re-sends its question's whole prompt with the answer after it
    ids = {r.hash_ids for r in recs}
    assert (
        sum(any(o[: len(r.hash_ids)] == r.hash_ids for o in ids if len(o) > len(r.hash_ids)) for r in recs)
        > 50
    )
    path = tmp_path / "rag.jsonl"
    write_mooncake(recs, path)
    assert load_mooncake(path) == recs


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
