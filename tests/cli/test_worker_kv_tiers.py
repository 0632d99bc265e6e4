"""The KV tier flags of ``interlock worker`` and ``serve`` reach the engine of every worker the
builder starts (as the worker process decodes its spec)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.cli import serve, worker
from interlock.cli.serving import cluster_spec, deployment_from_args
from interlock.cluster.spec import ProcessOptions, resolve_groups, worker_specs
from interlock.cluster.worker import WorkerLaunch
from interlock.errors import ConfigError

TIERS = ["--host-kv-gib", "2", "--disk-kv-gib", "8", "--disk-kv-path", "/var/kv", "--host-kv-shared", "node1"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096})
    )
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("command", [worker, serve])
def test_tier_flags_reach_every_workers_cache_config(command, model: Path) -> None:  # type: ignore[no-untyped-def]
    a = command.build_parser().parse_args(["--model", str(model), "--runner", "mock", *TIERS])
    d = deployment_from_args(a)
    specs = worker_specs(
        cluster_spec(a, d, frontend=None, processes=ProcessOptions()),
        resolve_groups(d, progress=False),
        prefix="t",
    )
    caches = {
        WorkerLaunch.decode(WorkerLaunch(s, "nats://127.0.0.1:4222").encode()).spec.engine.cache
        for s in specs
    }
    assert {(c.host_kv_gib, c.disk_kv_gib, c.disk_kv_path, c.host_kv_shared) for c in caches} == {
        (2.0, 8.0, "/var/kv", "node1")
    }


def test_a_disk_tier_without_a_path_is_refused(model: Path) -> None:
    a = worker.build_parser().parse_args(["--model", str(model), "--runner", "mock", "--disk-kv-gib", "8"])
    d = deployment_from_args(a)
    with pytest.raises(ConfigError, match="disk_kv_path"):
        worker_specs(
            cluster_spec(a, d, frontend=None, processes=ProcessOptions()),
            resolve_groups(d, progress=False),
            prefix="t",
        )
