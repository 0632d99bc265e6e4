"""The shared flags: ecosystem names, INTERLOCK_* variables, overrides of a file, --help, --version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock.cli import frontend, serve, worker
from interlock.cli.main import SUBCOMMANDS, main
from interlock.cli.serving import deployment_from_args
from interlock.env import flag_environment
from interlock.errors import ConfigError


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    flag_environment.cache_clear()
    yield monkeypatch
    flag_environment.cache_clear()


def serve_deployment(*argv: str):  # type: ignore[no-untyped-def]
    return serve.spec_from_args(serve.build_parser().parse_args(list(argv))).deployment


def test_flags_are_read_from_interlock_variables_and_the_command_line_wins(env: pytest.MonkeyPatch) -> None:
    env.setenv("INTERLOCK_MAX_NUM_SEQS", "7")
    env.setenv("INTERLOCK_ENABLE_PREFIX_CACHING", "false")
    env.setenv("INTERLOCK_ROUTER_MODE", "ignored: the flag's name is --policy")
    env.setenv("INTERLOCK_POLICY", "round_robin")
    d = serve_deployment()
    assert d.nodes[0].max_num_seqs == 7 and not d.execution_groups[0].enable_prefix_caching
    assert d.routing.policy == "round-robin"
    assert serve_deployment("--max-num-seqs", "9").nodes[0].max_num_seqs == 9


def test_a_bad_variable_is_refused_by_name(env: pytest.MonkeyPatch) -> None:
    env.setenv("INTERLOCK_RUNNER", "jax")
    with pytest.raises(ConfigError, match="INTERLOCK_RUNNER: 'jax' is not one of torch, mock"):
        serve.build_parser()
    env.setenv("INTERLOCK_RUNNER", "mock")
    env.setenv("INTERLOCK_SINGLE_PROCESS", "maybe")
    flag_environment.cache_clear()
    with pytest.raises(ConfigError, match="INTERLOCK_SINGLE_PROCESS: expected true or false"):
        serve.build_parser()


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (("--router-mode", "least_loaded"), lambda d: d.routing.policy == "least-loaded"),
        (("--no-enable-prefix-caching",), lambda d: not d.execution_groups[0].enable_prefix_caching),
        (("--no-prefix-caching",), lambda d: not d.execution_groups[0].enable_prefix_caching),
        ((), lambda d: d.execution_groups[0].enable_prefix_caching),
        (("--workers", "3"), lambda d: d.num_workers == 3),
        (("--kv-transfer", "none"), lambda d: d.nodes[0].transfer == "none"),
        (("--cache-transport", "tcp"), lambda d: d.nodes[0].transfer == "tcp"),
        (("--heartbeat-interval", "0.5"), lambda d: d.control_plane.lease_timeout == 2.5),
        ((), lambda d: d.execution_groups[0].max_model_len is None),  # the model's own, resolved per model
    ],
)
def test_ecosystem_names(argv: tuple[str, ...], check) -> None:  # type: ignore[no-untyped-def]
    assert check(serve_deployment(*argv))


def test_tier_load_flags_reach_every_node_group(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from interlock.deploy import DEFAULT_TIER_LOAD_MIN_MIB_S, DEFAULT_TIER_LOAD_TIMEOUT_S

    d = serve_deployment()
    assert (d.nodes[0].tier_load_timeout_s, d.nodes[0].tier_load_min_mib_s) == (
        DEFAULT_TIER_LOAD_TIMEOUT_S,
        DEFAULT_TIER_LOAD_MIN_MIB_S,
    )
    f = tmp_path / "d.yaml"
    f.write_text(
        "execution-group: {nodes: [{node_role: prefill}, {node_role: decode, tier_load_timeout_s: 9}]}\n"
    )
    d = serve_deployment("-f", str(f), "--tier-load-timeout", "0.5", "--tier-load-min-mib-s", "20")
    assert [(n.tier_load_timeout_s, n.tier_load_min_mib_s) for n in d.nodes] == [(0.5, 20.0), (0.5, 20.0)]
    env.setenv("INTERLOCK_TIER_LOAD_TIMEOUT", "3")
    env.setenv("INTERLOCK_TIER_LOAD_MIN_MIB_S", "10")
    flag_environment.cache_clear()
    d = serve_deployment()
    assert (d.nodes[0].tier_load_timeout_s, d.nodes[0].tier_load_min_mib_s) == (3.0, 10.0)
    with pytest.raises(ConfigError, match="tier_load_timeout_s"):
        serve_deployment("--tier-load-timeout", "0")


def test_parallel_sizes_reach_the_group_and_wrong_ones_are_refused_by_name() -> None:
    d = serve_deployment("--tensor-parallel-size", "2", "-pp", "3")
    assert (d.execution_groups[0].tensor_parallel_size, d.execution_groups[0].pipeline_parallel_size) == (
        2,
        3,
    )
    with pytest.raises(ConfigError, match="tensor_parallel_size and pipeline_parallel_size must be >= 1"):
        serve_deployment("-tp", "0")
    with pytest.raises(ConfigError, match="runner: tensor/pipeline parallelism runs the real model"):
        serve_deployment("-tp", "2", "--runner", "mock")


def test_flags_override_the_file_and_workers_is_refused_with_it(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(
        json.dumps(
            {
                "execution-group": {
                    "dtype": "float32",
                    "nodes": [
                        {"node_role": "prefill", "max_num_seqs": 4},
                        {"node_role": "decode", "max_num_seqs": 5},
                    ],
                }
            }
        )
    )
    d = serve_deployment("-f", str(f), "--max-num-seqs", "8")
    assert [n.max_num_seqs for n in d.nodes] == [8, 8] and d.execution_groups[0].dtype == "float32"
    assert [n.max_num_seqs for n in serve_deployment("-f", str(f)).nodes] == [4, 5]
    with pytest.raises(ConfigError, match="--workers: not used with -f"):
        serve_deployment("-f", str(f), "--workers", "3")


def test_frontend_takes_routing_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text("routing: {policy: random, route_key: x-team}\n")
    a = frontend.build_parser().parse_args(["-f", str(f), "--nats-url", "nats://h:4222"])
    d = deployment_from_args(a)
    assert (d.routing.policy, d.routing.route_key, d.control_plane.nats_url) == (
        "random",
        "x-team",
        "nats://h:4222",
    )


def test_migration_and_stall_settings_are_file_keys_that_flags_override(tmp_path: Path) -> None:
    from interlock.cluster.spec import service_options

    f = tmp_path / "d.yaml"
    f.write_text("routing: {migration_limit: 0, stall_timeout_s: 4.5}\n")
    a = frontend.build_parser().parse_args(["-f", str(f), "--nats-url", "nats://h:4222"])
    options = service_options(frontend.spec_from_args(a)).dispatch
    assert (options.migration_limit, options.stall_floor_s) == (0, 4.5)
    a = frontend.build_parser().parse_args(
        ["-f", str(f), "--nats-url", "nats://h:4222", "--migration-limit", "2"]
    )
    options = service_options(frontend.spec_from_args(a)).dispatch
    assert (options.migration_limit, options.stall_floor_s) == (2, 4.5)
    f.write_text("routing: {migration_limit: -1}\n")
    a = frontend.build_parser().parse_args(["-f", str(f), "--nats-url", "nats://h:4222"])
    with pytest.raises(ConfigError, match="migration_limit"):
        deployment_from_args(a)


def test_worker_spec_is_derived_as_serve_derives_it(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(b"")
    a = worker.build_parser().parse_args(
        [
            "--model",
            str(model),
            "--runner",
            "mock",
            "--role",
            "decode",
            "--nats-url",
            "nats://h:1",
            "--instance-id",
            "w9",
            "--kv-transfer",
            "tcp",
            "--max-num-seqs",
            "3",
            "--preempt-enabled",
            "--tier-load-timeout",
            "4",
            "--tier-load-min-mib-s",
            "25",
        ]
    )
    launch = worker.launch_from_args(a)
    s = launch.spec
    assert (s.instance_id, s.role, s.kv_transfer, s.engine.scheduler.max_num_seqs) == (
        "w9",
        "decode",
        "tcp",
        3,
    )
    assert s.engine.scheduler.preempt_enabled and s.engine.scheduler.max_model_len == 2048
    assert (s.engine.cache.tier_load_timeout_s, s.engine.cache.tier_load_min_mib_s) == (4.0, 25.0)
    assert launch.nats_url == "nats://h:1"


def test_help_shows_defaults_and_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        assert "``" not in out, name
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--migration-limit MIGRATION_LIMIT times a request" in out and "(default: 3)" in out
    assert "(default: the model's own context length)" in out


def test_a_bad_variable_exits_2_naming_it(
    env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("INTERLOCK_PORT", "eighty")
    assert main(["frontend"]) == 2
    assert "interlock frontend: INTERLOCK_PORT: 'eighty' is not a valid port" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from interlock import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"interlock {__version__}"


def test_frontend_builds_the_router_serve_builds(tmp_path: Path) -> None:
    """Same file, same router: policy, queue, health checks, disaggregation."""
    from interlock.cluster.spec import disagg_config, router_config, service_options

    f = tmp_path / "d.yaml"
    f.write_text(
        json.dumps(
            {
                "control-plane": {"heartbeat_interval": "2s", "health_check_enabled": True},
                "execution-group": {
                    "runner": "mock",
                    "nodes": [
                        {"node_role": "prefill", "max_num_batched_tokens": 256},
                        {"node_role": "decode"},
                    ],
                },
                "routing": {"policy": "least_loaded", "queue_size": 7, "fallback_to_local": False},
            }
        )
    )
    s = serve.spec_from_args(serve.build_parser().parse_args(["-f", str(f), "--migration-limit", "1"]))
    fa = frontend.build_parser().parse_args(
        ["-f", str(f), "--nats-url", "nats://h:1", "--migration-limit", "1"]
    )
    fr = frontend.spec_from_args(fa)
    for derive in (router_config, disagg_config, service_options):
        assert derive(s) == derive(fr), derive.__name__
    assert disagg_config(fr).enforce and router_config(fr).cost.chunk_tokens == 256


def test_process_flags_reach_the_builder() -> None:
    from interlock.cluster.supervisor import RestartPolicy

    s = serve.spec_from_args(
        serve.build_parser().parse_args(
            [
                "--single-process",
                "--drain-grace",
                "3",
                "--restart-policy",
                "never",
                "--ready-timeout",
                "9",
                "--kv-transfer-timeout",
                "4",
                "--api-key",
                "k1",
                "--stall-timeout",
                "7",
            ]
        )
    )
    p = s.processes
    assert (p.in_process, p.drain_grace_s, p.restart_policy, p.ready_timeout_s, p.kv_transfer_timeout_s) == (
        True,
        3.0,
        RestartPolicy.NEVER,
        9.0,
        4.0,
    )
    assert (
        s.frontend is not None
        and s.frontend.auth.api_keys == ("k1",)
        and s.deployment.routing.stall_timeout_s == 7.0
    )
    w = worker.build_parser().parse_args(
        [
            "--nats-url",
            "nats://h:1",
            "--host",
            "0.0.0.0",
            "--advertise-host",
            "10.0.0.2",
            "--kv-transfer-port",
            "5557",
        ]
    )
    wp = worker.spec_from_args(w).processes
    assert (wp.host, wp.advertise_host, wp.kv_transfer_port, wp.in_process) == (
        "0.0.0.0",
        "10.0.0.2",
        5557,
        False,
    )
