"""``shared_kv_cache`` (node key, ``--shared-kv-cache``): on by default for CPU workers that may
serve prefill to another worker (role both only without KV tiers), off for decode-only workers,
refused by name where a memfd cache cannot apply; the worker's engine gets what was resolved
(as its process decodes it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.cli import serve, worker
from interlock.cli.serving import cluster_spec, deployment_from_args
from interlock.cluster.spec import ProcessOptions, resolve_groups, worker_specs
from interlock.cluster.worker import WorkerLaunch
from interlock.deploy import parse_deployment
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig
from interlock.engine.factory import build_runner
from interlock.errors import ConfigError


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model folder with nothing to load (only the mock runner runs)."""
    config = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


def _shared(command, model: Path, *flags: str) -> set[bool]:  # type: ignore[no-untyped-def]
    a = command.build_parser().parse_args(["--model", str(model), "--runner", "mock", *flags])
    if command is worker:
        return {worker.launch_from_args(a).spec.engine.cache.shared_kv_cache}
    d = deployment_from_args(a)
    specs = worker_specs(
        cluster_spec(a, d, frontend=None, processes=ProcessOptions()),
        resolve_groups(d, progress=False),
        prefix="t",
    )
    launches = [WorkerLaunch.decode(WorkerLaunch(s, "nats://127.0.0.1:4222").encode()).spec for s in specs]
    return {s.engine.cache.shared_kv_cache for s in launches}


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ((), True),  # role both, CPU, a transfer agent: may serve prefill
        (("--role", "prefill"), True),
        (("--role", "decode"), False),  # copies from others' caches, never read from
        (("--host-kv-gib", "1"), False),  # both, with a tier: onboarding keeps huge pages
        (("--role", "prefill", "--host-kv-gib", "1"), True),  # its whole job is to be read
        (("--role", "decode", "--shared-kv-cache"), True),
        (("--no-shared-kv-cache",), False),
        (("--no-kv-cache-transfer",), False),
        (("--cache-transport", "tcp"), False),
    ],
)
def test_the_worker_flag_and_its_default(model: Path, flags: tuple[str, ...], want: bool) -> None:
    assert _shared(worker, model, "--nats-url", "nats://127.0.0.1:4222", *flags) == {want}


def test_serve_takes_the_flag_for_every_worker(model: Path) -> None:
    assert _shared(serve, model) == {True}
    assert _shared(serve, model, "--no-shared-kv-cache") == {False}


@pytest.mark.parametrize(
    ("group", "node", "match"),
    [
        ({"device": "cuda"}, {}, "shared_kv_cache: needs the KV cache on the CPU"),
        ({}, {"kv_cache_transfer": False}, "shared_kv_cache: needs a KV transfer agent"),
        ({}, {"cache_transport": "tcp"}, "shared_kv_cache: needs a KV transfer agent"),
    ],
)
def test_where_it_cannot_apply_it_is_refused_by_name(
    model: Path, group: dict, node: dict, match: str
) -> None:
    g = {"model": str(model), "runner": "mock", **group, "nodes": [{"shared_kv_cache": True, **node}]}
    with pytest.raises(ConfigError, match=match):
        parse_deployment({"execution-group": g})


def test_a_gpu_worker_is_not_shared_by_default(model: Path) -> None:
    g = {"model": str(model), "runner": "mock", "device": "cuda", "nodes": [{"node_role": "prefill"}]}
    assert parse_deployment({"execution-group": g}).execution_groups[0].nodes[0].shared_kv_cache is None
    with pytest.raises(ConfigError, match="shared_kv_cache needs the KV cache on the CPU"):
        EngineConfig(model=ModelConfig(device="cuda"), cache=CacheConfig(shared_kv_cache=True))


def test_the_engine_config_puts_the_runner_cache_on_a_memfd() -> None:
    on = build_runner(
        EngineConfig(model=ModelConfig(runner="mock"), cache=CacheConfig(num_blocks=8, shared_kv_cache=True))
    )
    off = build_runner(EngineConfig(model=ModelConfig(runner="mock"), cache=CacheConfig(num_blocks=8)))
    region = on.shared_region()
    assert region is not None and region.num_blocks == 8 and off.shared_region() is None
