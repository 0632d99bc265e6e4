"""``benchmarks/fleet_scale.py`` at a tiny size: 6 synthetic workers of 64 blocks, every phase.

It starts a nats-server, a TCP proxy, two fleet processes and the frontend (twice): the run
must converge after the start, the restart and the link cut, and serve every request; a second
frontend joining copies every worker's state from the first and asks no worker for a snapshot;
a frontend without an index routes to the holders by the first one's lookups, also while the
first restarts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_a_tiny_fleet_converges_in_every_phase_and_fails_no_request(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    args = ["--workers", "6", "--blocks", "64", "--procs", "2", "--rate", "2", "--duration", "3"]
    args += ["--cut-s", "2", "--converge-timeout", "30", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fleet_scale.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,  # about 25 s alone; several times that beside the suite's other workers
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    report = json.loads(out.read_text())
    phases = {p["name"]: p for p in report["phases"]}
    joins = ("second", "remote", "shards", "index_restart")  # no discovery of their own to time
    assert list(phases) == ["start", "steady", "restart", "cut", *joins]
    for name in ("start", "restart", "cut", *joins):
        assert phases[name]["converged_s"] is not None, name
        assert phases[name]["discovered_s"] is not None or name in joins, name
        assert phases[name]["timed_out"] == [], name
    for p in phases.values():
        assert p["failed"] == 0, (p["name"], p["errors"])
        assert p["slow_consumers"] == 0
    joined = phases["second"]["joined"]
    assert joined.get("pulls_replica") == 6 and joined.get("pulls_snapshot") == 0, joined
    remote = phases["remote"]["joined"]  # no index of its own: it asked the first, and pulled nothing
    assert remote.get("lookups_answered", 0) > 0 and not remote.get("pulls_snapshot"), remote
    shards = phases["shards"]  # two frontends keeping half the index each: the load went through one
    assert len(shards["shard_cpu_s"]) == 2 and shards["ok"] > 0 and shards["to_holder"] > 0
    assert shards["joined"].get("lookups_answered", 0) > 0, shards["joined"]
    apart = phases["index_restart"]  # served by the frontend without an index while the first restarted
    assert apart["ok"] > 0 and apart["joined"].get("lookups_answered", 0) > 0, apart["joined"]
    assert phases["steady"]["ok"] > 0
    assert phases["steady"]["lags_ms"] and phases["steady"]["lag_timeouts"] == 0
    assert "| steady |" in report["report"]
