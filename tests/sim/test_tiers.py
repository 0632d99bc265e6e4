"""Simulated host KV tiers: capacity, sharing between a host's workers, and replay sizing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlock.errors import ConfigError
from interlock.router import RouterConfig
from interlock.sim import ReplayConfig, SharedPrefixSpec, replay, shared_prefix_requests
from interlock.sim.tiers import SimTiers


def test_victim_lru_and_lookup() -> None:
    t = SimTiers(2, load_s_per_block=0.001)
    assert t.offload([1, 2]) == ([1, 2], [])
    assert t.offload([1, 3]) == ([3], [2])  # 1 touched, 2 the oldest
    assert t.lookup([1, 3, 2]) == 2 and t.lookup([2]) == 0
    assert t.load([1, 3]) == pytest.approx(0.002) and t.hit_blocks == 2
    with pytest.raises(ValueError):
        SimTiers(0)


def _sessions():
    spec = SharedPrefixSpec(
        num_requests=400,
        num_groups=8,
        system_tokens=512,
        suffix_tokens=256,
        output_tokens=32,
        turns=5,
        rate=6.0,
        seed=3,
    )
    return [replace(r, session_id=None) for r in shared_prefix_requests(spec)]


def _run(reqs, **kw):
    return replay(
        reqs,
        ReplayConfig(
            num_workers=4, num_blocks=80, workers_per_host=4, router=RouterConfig(policy="kv", seed=0), **kw
        ),
    )


def test_a_host_tier_serves_what_the_device_pools_evicted() -> None:
    reqs = _sessions()
    plain, tiered = _run(reqs), _run(reqs, host_kv_blocks=320)
    assert plain.num_completed == tiered.num_completed == 400
    assert tiered.hit_ratio > plain.hit_ratio + 0.05
    assert tiered.pooled_bound > plain.pooled_bound  # the bound counts the host tier too


def test_tiers_are_refused_where_they_are_not_modelled() -> None:
    with pytest.raises(ConfigError, match="fast backend"):
        ReplayConfig(host_kv_blocks=10, backend="engine")
    with pytest.raises(ConfigError, match="workers_per_host"):
        ReplayConfig(workers_per_host=0)


def test_replay_command_sizes_a_host_tier(tmp_path, capsys) -> None:
    import json

    from interlock.cli.replay import main as replay_main

    rows = [
        {
            "timestamp": i * 100,
            "input_length": 1500,
            "output_length": 20,
            "hash_ids": [0, 1 + i % 5, 10 + i % 7],
        }
        for i in range(80)
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    common = [str(trace), "--workers", "2", "--blocks-per-worker", "30", "--json"]
    assert replay_main(common) == 0
    plain = json.loads(capsys.readouterr().out)
    assert (
        replay_main([*common, "--host-kv-blocks", "200", "--workers-per-host", "2", "--host-load-ms", "0.2"])
        == 0
    )
    tiered = json.loads(capsys.readouterr().out)
    assert tiered["num_completed"] == plain["num_completed"] == 80
    assert tiered["hit_ratio"] > plain["hit_ratio"]
    # the host tier's shape without a host tier: refused by name, not ignored
    assert replay_main([*common, "--workers-per-host", "2"]) == 2
    assert "--host-kv-blocks" in capsys.readouterr().err
