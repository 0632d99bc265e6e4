"""``interlock plan``: a config on paper, this machine's CPU, pins, JSON, and the errors."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from interlock.cli.main import main
from interlock.cli.serve import build_parser as build_serve_parser
from interlock.cluster.layout import measure_copy_bandwidth
from interlock.deploy import parse_deployment

CONFIGS = Path(__file__).parents[2] / "examples" / "configs"
LLAMA_70B = str(CONFIGS / "llama-3-70b.json")
H100S = [
    "--devices",
    "8",
    "--device-memory-gib",
    "80",
    "--max-num-seqs",
    "256",
    "--max-num-batched-tokens",
    "8192",
]


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_llama_70b_on_paper_low_latency(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, LLAMA_70B, *H100S, "--profile", "low_latency")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(
        "model     llama-3-70b: 70.6B parameters, 2 bytes each (131.42 GiB); 80 layers"
    )
    assert "assumed   device-tflops 989 (an H100 SXM's)" in lines
    assert "plan      1 x (TP 8 x PP 1), aggregated" in lines
    assert "split     aggregated: one replica does both" in lines
    assert not any(line.startswith("run ") for line in lines)  # a config alone has no weights to serve
    header = lines.index("alternatives (best first):") + 1
    assert lines[header].split()[:3] == ["TP", "PP", "repl"]
    assert lines[header + 1].split()[:3] == ["7", "1", "1"] and "slower: " in lines[header + 1]
    assert lines[-1].split()[:3] == ["1", "1", "8"] and lines[-1].endswith("> 72.0 GiB usable a device")


def test_json_for_machines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, LLAMA_70B, *H100S, "--json")
    assert code == 0
    doc = json.loads(out)
    p = doc["plan"]
    assert (p["tensor"], p["pipeline"], p["replicas"], p["profile"]) == (4, 1, 2, "high_throughput")
    assert p["split"]["prefill"] == 0 and p["estimate"]["batch"] == 256
    assert p["alternatives"][-1]["estimate"] is None
    assert doc["model"]["parameters"] == 70_553_706_496 and doc["cluster"]["devices"] == 8
    assert doc["workload"]["max_num_seqs"] == 256


def test_pins_and_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, LLAMA_70B, *H100S, "-tp", "2", "--dtype", "fp8")
    assert code == 0
    assert "1 bytes each (65.71 GiB)" in out
    assert "why       pinned: tensor 2" in out
    assert "plan      4 x (TP 2 x PP 1), aggregated" in out


def test_mixture_of_experts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, str(CONFIGS / "mixtral-8x7b.json"), *H100S)
    assert code == 0
    assert "46.7B parameters, 8 experts (2 a token)" in out
    assert "plan      4 x (TP 2 x PP 1), aggregated" in out


def test_no_plan_lists_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = plan(capsys, LLAMA_70B, "--devices", "2", "--device-memory-gib", "40")
    assert code == 1 and out == ""
    assert "no plan: llama-3-70b fits no layout of 2 devices" in err
    assert err.count("does not fit: ") == 3


def test_bad_flags_name_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(capsys, LLAMA_70B, "--devices", "8")
    assert code == 2 and "interlock plan: --devices needs --device-memory-gib" in err
    code, _, err = plan(capsys, LLAMA_70B, *H100S, "-tp", "16")
    assert code == 2 and "the pinned sizes need 16 devices, the cluster has 8" in err
    code, _, err = plan(capsys, "no-such-model")
    assert code == 2 and err.startswith("interlock plan: ")


def test_a_config_the_engine_cannot_load_is_planned_without_its_cut_rule(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = json.loads(Path(LLAMA_70B).read_text())
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    config = tmp_path / "yarn.json"
    config.write_text(json.dumps(raw))
    code, out, _ = plan(capsys, str(config), *H100S)
    assert code == 0
    assert "note      Interlock's engine cannot load it (RoPE scaling 'yarn' is not supported" in out


def test_this_machine_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "smollm2", "--memory-bandwidth-gbs", "20", "--profile", "low_latency")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("model     SmolLM2-135M-Instruct: 134.5M parameters, 2 bytes each")
    assert lines[1].startswith("devices   1 x cpu (") and "20.0 GB/s" in lines[1]
    assert "plan      1 x (TP 1 x PP 1), aggregated" in lines  # one host: threads, not ranks
    assert any(line.startswith("assumed   compute 200 GFLOP/s a core") for line in lines)
    assert not any("measured now" in line for line in lines)  # the bandwidth was given
    assert any(line.startswith("plan      ") for line in lines)
    assert any(line.startswith("run       interlock serve --model smollm2 --workers ") for line in lines)


def test_copy_bandwidth_is_measured() -> None:
    assert measure_copy_bandwidth(nbytes=1 << 20, repeats=2) > 1e8


DOC = Path(__file__).parents[2] / "docs" / "partitioning.md"


def doc_commands() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)
    return [shlex.split(line, comments=True)[1:] for b in blocks for line in b.splitlines() if line.strip()]


def test_the_docs_commands_run_and_parse(capsys: pytest.CaptureFixture[str]) -> None:
    found = doc_commands()
    assert {argv[0] for argv in found} == {"plan", "serve"}
    for argv in found:
        if argv[0] == "plan":
            assert main(argv) == 0, argv
        else:
            build_serve_parser().parse_args(argv[1:])
    capsys.readouterr()


def test_the_docs_deployment_files_parse() -> None:
    profile, sizes, colocated = (
        parse_deployment(yaml.safe_load(block)).execution_groups[0]
        for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    )
    assert profile.optimization_profile == "low_latency"
    assert (sizes.tensor_parallel_size, sizes.pipeline_parallel_size, sizes.num_workers) == (2, 1, 1)
    (guest,) = colocated.colocate
    assert (guest.served_model_name, guest.offload_after_s, guest.nodes[0].kv_cache_gib) == (
        "other",
        300.0,
        0.125,
    )


def test_this_machine_s_cores_as_devices_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "smollm2", "--memory-bandwidth-gbs", "20", "--cpu-cores-as-devices")
    assert code == 0
    assert "x cpu core (" in out.splitlines()[1]


def test_flags_of_other_hosts_are_refused_for_this_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(capsys, "smollm2", "--memory-bandwidth-gbs", "20", "--devices-per-host", "4")
    assert code == 2 and "--devices-per-host: with no --devices the plan is for this one host" in err
    code, _, err = plan(capsys, LLAMA_70B, *H100S, "--cpu-cores-as-devices")
    assert code == 2 and "--cpu-cores-as-devices describes this machine: not with --devices" in err


def test_this_machine_s_figures_given_are_used(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(
        capsys, "smollm2", "--memory-bandwidth-gbs", "20", "--device-tflops", "1.5", "--link-gbs", "7"
    )
    assert code == 0
    assert "1.5 TFLOP/s" in out.splitlines()[1] and "link 7.0 GB/s" in out.splitlines()[1]
