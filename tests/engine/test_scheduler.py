from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interlock.engine.block_pool import BlockPool
from interlock.engine.config import SchedulerConfig
from interlock.engine.kv_cache_manager import KVCacheManager
from interlock.engine.request import Request, RequestStatus
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.scheduler import Scheduler
from interlock.errors import InvalidRequest, PromptTooLong
from interlock.protocol import GenerateOutput, KVTransferParams, SamplingParams
from tests.engine.conftest import VOCAB, make_engine, request, run_to_end, tokens

BS = 4


class Rig:
    """Scheduler + mock runner driven by hand, one step at a time."""

    def __init__(
        self,
        *,
        num_blocks: int = 32,
        budget: int = 16,
        max_seqs: int = 8,
        watermark: float = 0.0,
        preempt: bool = False,
    ) -> None:
        self.kv = KVCacheManager(BlockPool(num_blocks, BS), watermark=watermark)
        config = SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=max_seqs,
            max_model_len=512,
            preempt_enabled=preempt,
        )
        self.sched = Scheduler(config, self.kv)
        self.runner = MockRunner(num_blocks=num_blocks, block_size=BS, vocab_size=VOCAB, timing=None)
        self.n = 0

    def add(self, rid: str, prompt: list[int], max_tokens: int = 4, **kw: object) -> Request:
        self.n += 1
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(rid, tuple(prompt), sp, block_size=BS, arrival=self.n, **kw)  # type: ignore[arg-type]
        self.sched.add_request(req)
        return req

    def step(self) -> tuple[dict[str, int], list[GenerateOutput]]:
        batch = self.sched.schedule()
        sizes = {s.request_id: len(s.token_ids) for s in batch.scheduled}
        assert sum(sizes.values()) <= self.sched.max_num_batched_tokens
        assert len(sizes) <= self.sched.max_num_seqs
        outs = self.sched.update(batch, self.runner.execute(batch))
        self.kv.check_integrity()
        return sizes, outs


def test_chunked_prefill_chunk_sizes() -> None:
    rig = Rig(budget=8)
    rig.add("a", list(range(20)))
    assert [rig.step()[0] for _ in range(4)] == [{"a": 8}, {"a": 8}, {"a": 4}, {"a": 1}]


def test_continuous_batching_admits_while_others_decode() -> None:
    rig = Rig(budget=8)
    rig.add("a", list(range(6)))
    assert rig.step()[0] == {"a": 6}
    rig.add("b", list(range(10, 30)))
    # a decodes one token, b gets the rest of the budget as a prefill chunk.
    assert rig.step()[0] == {"a": 1, "b": 7}
    assert rig.step()[0] == {"a": 1, "b": 7}
    assert rig.step()[0] == {"a": 1, "b": 6}


def test_max_num_seqs_limits_the_batch() -> None:
    rig = Rig(budget=64, max_seqs=2)
    for i in range(3):
        rig.add(f"r{i}", [i + 1] * 3)
    assert set(rig.step()[0]) == {"r0", "r1"}
    assert rig.sched.num_waiting == 1


def test_prefix_hit_starts_with_computed_tokens() -> None:
    rig = Rig(budget=64)
    prompt = list(range(50, 61))  # 11 tokens: two full blocks
    rig.add("a", prompt)
    while rig.sched.has_unfinished():
        rig.step()
    rig.add("b", prompt + [7, 8])
    sizes, outs = rig.step()
    assert sizes == {"b": 5}  # 13 tokens, 8 from cache
    assert outs[0].num_cached_tokens == 8
    rig.add("c", prompt[:8])  # whole prompt cached: the last block is recomputed
    sizes, outs = rig.step()
    by_id = {o.request_id: o for o in outs}
    assert sizes["c"] == 4 and by_id["c"].num_cached_tokens == 4


def test_prefix_hits_give_the_same_tokens() -> None:
    engine = make_engine(block_size=4)
    prompt = list(range(100, 130))
    engine.add_request(request("a", prompt, 10))
    first = run_to_end(engine)["a"]
    engine.add_request(request("b", prompt, 10))
    second = run_to_end(engine)["b"]
    assert tokens(first) == tokens(second) == reference_output(prompt, 10, vocab_size=VOCAB)
    assert first[0].num_cached_tokens == 0 and second[0].num_cached_tokens == 28


def _run_batch(num_blocks: int, budget: int, seed: int = 0) -> tuple[dict[str, list[int]], int]:
    rng = random.Random(seed)
    engine = make_engine(num_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=8)
    prompts = {f"r{i}": [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))] for i in range(12)}
    for rid, p in prompts.items():
        engine.add_request(request(rid, p, 16))
    preemptions = 0

    def count(_: int) -> None:
        nonlocal preemptions
        preemptions += sum(r.status == RequestStatus.PREEMPTED for r in engine.scheduler.waiting)

    outs = run_to_end(engine, each_step=count)
    return {rid: tokens(o) for rid, o in outs.items()}, preemptions


def test_preemption_by_recompute_gives_the_same_outputs() -> None:
    big, big_preempted = _run_batch(num_blocks=256, budget=64)
    tiny, tiny_preempted = _run_batch(num_blocks=12, budget=64)
    assert big_preempted == 0 and tiny_preempted > 0
    assert tiny == big


def test_preemption_takes_the_newest_request() -> None:
    rig = Rig(num_blocks=4, budget=64)
    rig.add("old", [1] * 7, max_tokens=8)  # 2 blocks now, up to 4
    rig.add("new", [2] * 7, max_tokens=8)
    rig.step()
    rig.step()
    rig.step()  # both need a third block: only "new" can lose
    assert rig.sched.waiting[0].request_id == "new"
    assert rig.sched.waiting[0].status == RequestStatus.PREEMPTED
    assert [r.request_id for r in rig.sched.running] == ["old"]


def test_waiting_queue_serves_lower_priority_values_first_then_older() -> None:
    rig = Rig(max_seqs=1, budget=64)
    rig.add("running", [9] * 4, max_tokens=8)
    rig.step()
    for rid, prio in (("p5-old", 5), ("p0", 0), ("p5-new", 5), ("p-3", -3)):
        rig.add(rid, [1] * 4, priority=prio)
    assert [r.request_id for r in rig.sched.waiting] == ["p-3", "p0", "p5-old", "p5-new"]


def test_preempted_request_keeps_its_place_among_its_priority() -> None:
    rig = Rig(num_blocks=4, budget=64)
    rig.add("old", [1] * 7, max_tokens=8, priority=1)
    rig.add("new", [2] * 7, max_tokens=8, priority=1)
    for _ in range(3):
        rig.step()  # "new" preempted for a block
    rig.add("newest", [3] * 3, priority=1)
    rig.add("urgent", [4] * 3, priority=0)
    assert [r.request_id for r in rig.sched.waiting] == ["urgent", "new", "newest"]


def _full_engine(preempt: bool, *, max_seqs: int = 1, num_blocks: int = 32, steps: int = 2) -> Rig:
    rig = Rig(max_seqs=max_seqs, num_blocks=num_blocks, budget=64, preempt=preempt)
    rig.add("bulk", [1] * 11, max_tokens=9, priority=5)
    for _ in range(steps):
        rig.step()
    return rig


def test_with_preempt_enabled_a_more_important_request_takes_the_slot() -> None:
    rig = _full_engine(True)
    rig.add("urgent", [2] * 6, priority=0)
    sizes, _ = rig.step()
    assert sizes == {"urgent": 6}
    assert [r.request_id for r in rig.sched.waiting] == ["bulk"]
    assert rig.sched.waiting[0].status == RequestStatus.PREEMPTED


def test_with_preempt_enabled_a_less_important_request_never_preempts() -> None:
    rig = _full_engine(True)
    rig.add("background", [2] * 6, priority=9)
    rig.add("peer", [3] * 6, priority=5)  # equal priority does not preempt either
    sizes, _ = rig.step()
    assert sizes == {"bulk": 1}
    assert [r.request_id for r in rig.sched.waiting] == ["peer", "background"]


def test_without_preempt_enabled_nothing_is_preempted_for_priority() -> None:
    rig = _full_engine(False)
    rig.add("urgent", [2] * 6, priority=0)
    sizes, _ = rig.step()
    assert sizes == {"bulk": 1}
    assert [r.request_id for r in rig.sched.waiting] == ["urgent"]
    assert [r.request_id for r in rig.sched.running] == ["bulk"]


def test_with_preempt_enabled_a_more_important_request_takes_blocks() -> None:
    # 5 blocks of 4, "bulk" holds 4 after 13 tokens: "urgent" needs 2.
    rig = _full_engine(True, max_seqs=4, num_blocks=5, steps=3)
    assert len(rig.kv.block_table("bulk")) == 4
    rig.add("urgent", [2] * 6, priority=0)
    sizes, _ = rig.step()
    assert sizes == {"urgent": 6}  # bulk's decode token this step was given back
    assert [r.request_id for r in rig.sched.waiting] == ["bulk"]
    off = _full_engine(False, max_seqs=4, num_blocks=5, steps=3)
    off.add("urgent", [2] * 6, priority=0)
    assert off.step()[0] == {"bulk": 1}


def test_priority_preemption_in_the_engine_keeps_outputs_and_finishes_urgent_first() -> None:
    engine = make_engine(num_blocks=12, max_num_batched_tokens=32, max_num_seqs=2, preempt=True)
    prompts = {f"bulk{i}": [10 + i] * 12 for i in range(2)}
    for rid, p in prompts.items():
        engine.add_request(request(rid, p, 20, priority=1))
    early = [o for _ in range(3) for o in engine.step().outputs]
    prompts["urgent"] = [7] * 12
    engine.add_request(request("urgent", prompts["urgent"], 4, priority=0))
    finished: list[str] = []

    def watch(_: int) -> None:
        finished.extend(
            rid for rid in prompts if rid not in finished and rid not in engine.scheduler.requests
        )

    outs = run_to_end(engine, each_step=watch)
    watch(0)
    assert finished[0] == "urgent"
    for rid, p in prompts.items():
        assert tokens([o for o in early if o.request_id == rid] + outs[rid]) == reference_output(
            p, 4 if rid == "urgent" else 20, vocab_size=VOCAB
        )


def test_watermark_keeps_headroom_at_admission() -> None:
    rig = Rig(num_blocks=10, budget=64, watermark=0.3)  # 3 blocks kept free
    rig.add("a", [1] * 15, max_tokens=2)  # nothing running: admitted (4 blocks)
    rig.step()
    rig.add("b", [2] * 12, max_tokens=2)  # 3 more blocks would leave 3: ok
    rig.add("c", [3] * 4, max_tokens=2)  # 1 more would leave 2 < 3: waits
    sizes, _ = rig.step()
    assert set(sizes) == {"a", "b"} and rig.sched.waiting[0].request_id == "c"


def test_remote_kv_waiting_holds_blocks_but_no_slot() -> None:
    rig = Rig(num_blocks=32, budget=64, max_seqs=1)
    kt = KVTransferParams(do_remote_prefill=True)
    rig.add("remote", list(range(10)), kv_transfer=kt)
    rig.add("local", [5] * 5)
    sizes, _ = rig.step()
    assert sizes == {"local": 5}
    assert rig.sched.remote_parked["remote"].status == RequestStatus.WAITING_FOR_REMOTE_KV
    assert len(rig.kv.block_table("remote")) == 3
    assert rig.sched.num_running == 1


def test_too_long_and_never_fitting_requests_are_rejected() -> None:
    rig = Rig(num_blocks=4)
    with pytest.raises(PromptTooLong):
        rig.add("long", [1] * 500, max_tokens=20)
    with pytest.raises(PromptTooLong):
        rig.add("big", [1] * 14, max_tokens=4)  # 18 tokens: 5 blocks > 4
    rig.add("ok", [1] * 12, max_tokens=4)
    with pytest.raises(InvalidRequest):
        rig.add("ok", [1], max_tokens=1)
    assert rig.sched.num_waiting == 1 and rig.kv.pool.num_used_blocks == 0


def test_no_chunking_without_chunked_prefill() -> None:
    engine = make_engine(max_num_batched_tokens=256, max_model_len=256, chunked=False)
    engine.add_request(request("a", list(range(200)), 4))
    engine.add_request(request("b", list(range(100)), 4))
    first = engine.step()
    assert first.load.tokens_computed == 200  # b does not fit in the rest of the budget


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(8, 40),
    budget=st.sampled_from([1, 3, 8, 64]),
    max_seqs=st.integers(1, 6),
    watermark=st.sampled_from([0.0, 0.1]),
)
def test_any_schedule_gives_the_reference_outputs(
    seed: int, num_blocks: int, budget: int, max_seqs: int, watermark: float
) -> None:
    """Whatever the pool, budget, slots and prefix sharing: every request gets exactly what the
    model generates for it alone."""
    rng = random.Random(seed)
    engine = make_engine(
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        watermark=watermark,
    )
    shared = [rng.randrange(VOCAB) for _ in range(9)]
    prompts: dict[str, list[int]] = {}
    for i in range(8):
        own = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 14))]
        prompts[f"r{i}"] = (shared[: rng.randrange(10)] + own)[: 4 * num_blocks - 8]
        engine.add_request(request(f"r{i}", prompts[f"r{i}"], 8))
    outs = run_to_end(engine)
    for rid, p in prompts.items():
        assert tokens(outs[rid]) == reference_output(p, 8, vocab_size=VOCAB), rid
    assert engine.pool.num_used_blocks == 0


def test_queued_requests_holding_all_blocks_give_way_to_older_ones() -> None:
    """Two requests parked for remote KV fill the pool; when the older one's KV comes it needs
    one more block and nothing runs that could be preempted: the newer one gives its blocks
    back, re-parks later, and both finish."""
    engine = make_engine(num_blocks=6)
    kt = KVTransferParams(do_remote_prefill=True, first_token_id=5)
    for rid in ("old", "new"):
        engine.add_request(msgspec.structs.replace(request(rid, list(range(1, 13)), 4), kv_transfer=kt))
    engine.step()
    assert set(engine.scheduler.remote_parked) == {"old", "new"} and engine.pool.num_free_blocks == 0
    assert engine.finish_remote_kv("old", None)  # KV lost: recompute 13 tokens, 4 blocks
    outs: dict[str, list[GenerateOutput]] = {}
    for _ in range(20):
        for o in engine.step().outputs:
            outs.setdefault(o.request_id, []).append(o)
        engine.check_integrity()
    assert outs["old"][-1].finish_reason == "length" and len(tokens(outs["old"])) == 4
    assert "new" in engine.scheduler.remote_parked  # parked again once blocks were free
    assert engine.finish_remote_kv("new", None)
    assert len(tokens(run_to_end(engine)["new"])) == 4
