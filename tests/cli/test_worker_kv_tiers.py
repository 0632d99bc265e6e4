"""The KV tier flags of ``interlock worker`` (and of ``serve``, which passes them to its workers)."""

from __future__ import annotations

import pytest

from interlock.cli.serve import worker_argv
from interlock.cli.worker import WorkerSpec, build_parser, engine_config_from_args
from interlock.deploy import ControlPlane
from interlock.errors import ConfigError


def test_tier_flags_fill_the_cache_config_and_reach_serve_workers() -> None:
    a = build_parser().parse_args(
        ["--host-kv-gib", "2", "--disk-kv-gib", "8", "--disk-kv-path", "/var/kv",
         "--host-kv-shared", "node1"])
    cache = engine_config_from_args(a, "m").cache
    assert (cache.host_kv_gib, cache.disk_kv_gib, cache.disk_kv_path, cache.host_kv_shared) == (
        2.0, 8.0, "/var/kv", "node1")
    spec = WorkerSpec(engine=engine_config_from_args(a, "m"), served_name="m", model_path="m",
                      role="both", instance_id="w0")
    argv = worker_argv(spec, "nats://x", ControlPlane(), 1.0)
    back = build_parser().parse_args(argv[argv.index("worker") + 1:])
    assert engine_config_from_args(back, "m").cache == cache


def test_a_disk_tier_without_a_path_is_refused() -> None:
    a = build_parser().parse_args(["--disk-kv-gib", "8"])
    with pytest.raises(ConfigError, match="disk_kv_path"):
        engine_config_from_args(a, "m")
