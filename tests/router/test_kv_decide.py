"""The contract between the two ``kv`` deciders (``router/kv_decide.py``): the compiled one
decides exactly as the reference, costs to the last bit, ranking, choice and overlaps, on
randomized router states (weights, masks, lower tiers, both stall counts, room priced or not)
and on a whole replay; and either decides the same on a replica's lookup (``kv_lookup``) as on
its own index."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest

from interlock.protocol.discovery import InstanceInfo
from interlock.protocol.events import BlockStored, KVEventBatch, LoadReport
from interlock.router import RequestMeta, Router, RouterConfig
from interlock.router.cost import CostParams
from interlock.router.kv_decide import KvRequest, ReferenceDecider
from interlock.router.kv_lookup import RemoteChain, lookup_of
from interlock.router.route_kernel import CompiledDecider
from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay
from interlock.sim.synthetic import AgentSpec, agent_records

BS = 8


def _router(cost: CostParams, n: int, rng: random.Random) -> tuple[Router, list[list[int]]]:
    r = Router(RouterConfig(block_size=BS, cost=cost, seed=0, share_load=False, num_candidates=4))
    if not isinstance(r.decider, CompiledDecider):
        pytest.skip("no compiled decision on this machine (no C compiler)")
    for w in range(n):
        r.add_worker(
            InstanceInfo(instance_id=f"w{w}", endpoint="e", model="m", block_size=BS, kv_blocks_total=400)
        )
    prefixes = [[rng.getrandbits(63) for _ in range(rng.randint(2, 24))] for _ in range(5)]
    return r, prefixes


def _disturb(
    r: Router, prefixes: list[list[int]], rng: random.Random, t: float, seqs: dict[int, int]
) -> None:
    """Some workers store a prefix (in lower tiers too, now and then) and report load."""
    n = len(seqs)
    for w in rng.sample(range(n), 3):
        head = rng.choice(prefixes)
        chain = head[: rng.randint(1, len(head))]
        cut = rng.randint(0, len(chain))
        events = [
            BlockStored(block_hashes=tuple(chain[:cut]) or (rng.getrandbits(63),), parent_block_hash=None)
        ]
        if rng.random() < 0.3 and cut < len(chain):
            events.append(BlockStored(block_hashes=tuple(chain[cut:]), parent_block_hash=None, tier="host"))
        seqs[w] += 1
        r.apply_events(KVEventBatch(instance_id=f"w{w}", seq=seqs[w], timestamp=t, events=tuple(events)))
        r.apply_load(
            LoadReport(
                instance_id=f"w{w}",
                timestamp=t,
                num_running=rng.randint(0, 12),
                num_waiting=rng.randint(0, 3),
                kv_blocks_used=rng.randint(0, 400),
                kv_blocks_total=400,
                queued_prefill_tokens=rng.choice((0, rng.randint(1, 20_000))),
                step_time_s=rng.uniform(0.01, 0.2),
                tokens_computed=rng.randint(1, 8000),
                decode_step_s=rng.choice((0.0, rng.uniform(0.01, 0.04))),
            )
        )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "cost",
    [
        CostParams(),
        CostParams(stall_over="inflight", price_room=False),
        CostParams(kv_penalty=2.0, backlog_charge=False, decode_weight=0.0, stall_weight=0.0),
        CostParams(chunk_tokens=256, miss_weight=1.0),
    ],
    ids=["default", "inflight-no-room", "penalty-no-backlog", "small-chunks"],
)
def test_the_compiled_decider_decides_as_the_reference(cost: CostParams, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice((3, 9, 70))
    r, prefixes = _router(cost, n, rng)
    compiled = r.decider
    reference = ReferenceDecider(r.indexer, r.load, r.config.cost, 4, np.random.default_rng(0))
    seqs = dict.fromkeys(range(n), -1)
    for i in range(120):
        _disturb(r, prefixes, rng, 0.01 * i, seqs)
        head = rng.choice(prefixes)
        hashes = head[: rng.randint(0, len(head))] + [rng.getrandbits(63) for _ in range(rng.randint(0, 6))]
        mask = np.array([rng.random() < 0.8 for _ in range(n)])
        mask[rng.randrange(n)] = True
        whole = bool(mask.all())
        weight = np.array([rng.choice((1.0, 0.5, 0.25)) for _ in range(n)]) if rng.random() < 0.3 else None
        prompt = max(len(hashes) * BS - rng.randrange(BS), 1)
        req = KvRequest(hashes, prompt, rng.randint(1, 800), mask, whole, weight, i, n)
        want = reference.decide(req)
        got = compiled.decide(req)
        assert np.array_equal(got.costs, want.costs), i
        assert (got.ranked, got.slot) == (want.ranked, want.slot), i
        assert [got.held(s) for s in range(n)] == [want.held(s) for s in range(n)], i
        looked = _as_looked_up(r, req)  # the same lookup, made by a replica (``kv_lookup``)
        for decider in (reference, compiled):
            alt = decider.decide(looked)
            assert np.array_equal(alt.costs, want.costs), (decider.name, i)
            assert (alt.ranked, alt.slot) == (want.ranked, want.slot), (decider.name, i)
            assert [alt.held(s) for s in range(n)] == [want.held(s) for s in range(n)], (decider.name, i)
        if rng.random() < 0.5:  # some load of its own on the workers (in flight, decoding)
            d = r.route(RequestMeta(f"r{i}", prompt, max_tokens=64), block_hashes=hashes, may_wait=False)
            if rng.random() < 0.5:
                r.on_first_token(d.request_id)


def _as_looked_up(r: Router, req: KvRequest) -> KvRequest:
    """``req`` with its prefix lookup made as a frontend without an index gets it: a replica's
    ``kv_holders`` answer, carried by a ``RemoteChain``, as per-slot vectors."""
    workers, device, lower = r.kv_holders(req.hashes)
    below = lower if lower is not None else [0] * len(workers)
    chain = RemoteChain(
        req.hashes, dict(zip(workers, zip(device, below, strict=True), strict=True)), lower is not None
    )
    lookup = lookup_of(chain, r._slot_of, len(req.mask))
    return msgspec.structs.replace(req, hashes=chain, lookup=lookup)


def _replay_decisions(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> tuple[list[tuple], float]:
    if not compiled:
        monkeypatch.setattr(CompiledDecider, "for_router", classmethod(lambda cls, reference: None))
    made: list[Router] = []
    log: list[tuple] = []
    commit = Router._commit

    def _commit(self, d, meta, hashes, now):  # type: ignore[no-untyped-def]
        made.append(self)
        log.append((d.request_id, d.worker_id, d.reason, d.overlap_blocks))
        return commit(self, d, meta, hashes, now)

    monkeypatch.setattr(Router, "_commit", _commit)
    records = agent_records(AgentSpec(num_sessions=40, seed=3, rate=2.0))
    blocks = len({h for r in records for h in r.hash_ids}) * 8 // 12
    reqs = mooncake_requests(records, block_size=64, speedup=3.0, hasher=TraceHasher())
    cfg = ReplayConfig(
        num_workers=6, num_blocks=blocks, router=RouterConfig(policy="kv", block_size=64, seed=0)
    )
    report = replay(reqs, cfg)
    monkeypatch.undo()
    names = {rt.decider.name for rt in made}
    assert names == {"compiled" if compiled else "reference"}
    return log, report.hit_ratio


def test_a_whole_replay_decides_the_same_with_either_decider(monkeypatch: pytest.MonkeyPatch) -> None:
    if not isinstance(Router(RouterConfig()).decider, CompiledDecider):
        pytest.skip("no compiled decision on this machine (no C compiler)")
    compiled, hit_c = _replay_decisions(monkeypatch, compiled=True)
    reference, hit_r = _replay_decisions(monkeypatch, compiled=False)
    assert len(compiled) > 300
    assert compiled == reference
    assert hit_c == hit_r
