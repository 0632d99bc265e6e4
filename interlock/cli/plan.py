"""``interlock plan MODEL``: how to cut a model over devices (tensor x pipeline x replicas, the
prefill/decode split), why, and every layout it rejected (``planner.parallel_plan``).

MODEL is a known name or a local model folder (``model_store.resolve_model``), or a path to a
Hugging Face ``config.json`` alone (a 70B model is planned on paper from its config:
``examples/configs/``). The devices come from the flags; with no ``--devices`` this machine's
CPU is described (``cluster.layout``: one device whose cores are one worker's threads, an
assumed 200 GFLOP/s a core, the bandwidth of a one-thread copy measured now; with
``--cpu-cores-as-devices`` one core a device). Every figure that was assumed rather than given
or measured is printed under "assumed". The engine's own partition rule
(``engine.model.partition.check_sizes``) says which cuts are possible.

    interlock plan smollm2
    interlock plan examples/configs/llama-3-70b.json --devices 8 --device-memory-gib 80 --profile low_latency
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from interlock.cli import flags
from interlock.cluster.layout import H100, INTER_HOST, describe_cpu, model_shape
from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from interlock.errors import ConfigError
from interlock.model_store import resolve_model
from interlock.planner.parallel_plan import (
    PROFILES,
    CanCut,
    Cluster,
    DeviceSpec,
    ModelShape,
    NoPlan,
    Pins,
    Plan,
    Workload,
    choose,
)
from interlock.planner.parallel_shapes import DTYPE_BYTES, GIB

DTYPES = {"auto": None, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


def build_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock plan", __doc__ or "")
    p.add_argument("model", help="a known name, a model folder, or a config.json")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), default="auto", help="weights' precision; auto: the config's"
    )
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    d = p.add_argument_group("devices (none given: this machine's CPU cores)")
    d.add_argument("--devices", type=int, default=None, help="devices in all")
    d.add_argument("--device-memory-gib", type=float, default=None, help="memory of one device")
    d.add_argument("--device-tflops", type=float, default=None, help="dense TFLOP/s of one device")
    d.add_argument("--memory-bandwidth-gbs", type=float, default=None, help="GB/s of one device's memory")
    d.add_argument("--link-gbs", type=float, default=None, help="GB/s between two devices of a host")
    d.add_argument("--link-latency-us", type=float, default=None, help="one collective's latency in a host")
    d.add_argument("--devices-per-host", type=int, default=None, help="default: all, at most 8")
    d.add_argument("--inter-host-gbs", type=float, default=None, help="GB/s a device between hosts")
    d.add_argument("--headroom", type=float, default=0.1, help="fraction of each device's memory kept free")
    d.add_argument(
        "--cpu-cores-as-devices",
        action="store_true",
        help="with no --devices: this CPU's cores as devices (default: the host is one device, its "
        "cores one worker's threads, which measured faster than ranks)",
    )
    w = p.add_argument_group("workload and choice")
    w.add_argument("--profile", choices=PROFILES, default="high_throughput")
    w.add_argument("--prompt-tokens", type=int, default=1024, help="the mean prompt")
    w.add_argument("--output-tokens", type=int, default=256, help="the mean output")
    w.add_argument(
        "--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, help="sequences a replica at most"
    )
    w.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    w.add_argument("--tensor-parallel-size", "-tp", type=int, default=None, help="pin the tensor size")
    w.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None, help="pin the pipeline size")
    w.add_argument("--replicas", type=int, default=None, help="pin the replicas")
    p.add_argument("--json", action="store_true", help="the plan as one JSON object")
    return flags.apply_environment(p)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return flags.run_checked("interlock plan", run, args)


def run(args: argparse.Namespace) -> int:
    shape, can_cut, notes = load_model(args)
    cluster = describe_devices(args)
    workload = Workload(
        args.prompt_tokens, args.output_tokens, args.max_num_seqs, args.max_num_batched_tokens
    )
    pins = Pins(args.tensor_parallel_size, args.pipeline_parallel_size, args.replicas)
    head = header(shape, cluster, workload, args.profile, notes)
    try:
        plan = choose(shape, cluster, profile=args.profile, workload=workload, can_cut=can_cut, pins=pins)
    except NoPlan as e:
        print("\n".join(head), file=sys.stderr)
        print(f"\nno plan: {e.message}\n" + "\n".join(table(e.alternatives)), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(as_json(plan, shape, cluster, workload, notes), indent=2))
    else:
        serve = None if args.model.endswith(".json") else args.model
        print("\n".join(head + [""] + render(plan, serve)))
    return 0


def load_model(args: argparse.Namespace) -> tuple[ModelShape, CanCut, list[str]]:
    """The model's shape, the engine's cut rule for it, and notes on what was read."""
    path = Path(args.model)
    if path.suffix == ".json" and path.is_file():
        config, name = path, path.stem
    else:
        folder = resolve_model(args.model, progress=False)
        config, name = folder / "config.json", folder.name
    shape, can_cut, notes = model_shape(config, name)
    return _with_overrides(shape, args), can_cut, notes


def _with_overrides(shape: ModelShape, args: argparse.Namespace) -> ModelShape:
    changes: dict[str, Any] = {}
    if args.max_model_len:
        changes["context_length"] = args.max_model_len
    dtype = DTYPES[args.dtype]
    if dtype:
        changes["bytes_per_param"] = DTYPE_BYTES[dtype]
        changes["activation_bytes"] = 4 if args.dtype == "fp32" else 2
        changes["kv_bytes_per_token"] = 0  # recomputed from the new activation bytes
    return dataclasses.replace(shape, **changes) if changes else shape


def describe_devices(args: argparse.Namespace) -> Cluster:
    """The cluster the flags describe; with no ``--devices``, this machine's CPU cores."""
    if args.devices is None:
        return _this_cpu(args)
    if args.cpu_cores_as_devices:
        raise ConfigError("--cpu-cores-as-devices describes this machine: not with --devices")
    if args.device_memory_gib is None:
        raise ConfigError("--devices needs --device-memory-gib")
    given = {
        k: getattr(args, k) for k in ("device_tflops", "memory_bandwidth_gbs", "link_gbs", "link_latency_us")
    }
    assumed = [
        f"{k.replace('_', '-')} {v:g} (an H100 SXM's)"
        for k, v in _h100_defaults().items()
        if given[k] is None
    ]
    pick = {k: v if v is not None else _h100_defaults()[k] for k, v in given.items()}
    per_host = args.devices_per_host or min(args.devices, 8)
    if args.devices > per_host and args.inter_host_gbs is None:
        assumed.append(f"inter-host {INTER_HOST['gbs']:g} GB/s a device, {INTER_HOST['us']:g} us")
    device = DeviceSpec(
        int(args.device_memory_gib * GIB),
        pick["device_tflops"] * 1e12,
        pick["memory_bandwidth_gbs"] * 1e9,
        "device",
    )
    return _cluster(
        args, device, args.devices, per_host, pick["link_gbs"] * 1e9, pick["link_latency_us"], assumed
    )


def _h100_defaults() -> dict[str, float]:
    return {
        "device_tflops": H100["tflops"],
        "memory_bandwidth_gbs": H100["bandwidth_gbs"],
        "link_gbs": H100["link_gbs"],
        "link_latency_us": H100["link_us"],
    }


def _this_cpu(args: argparse.Namespace) -> Cluster:
    other_hosts = [f for f in ("devices_per_host", "inter_host_gbs") if getattr(args, f) is not None]
    if other_hosts:
        flags = ", ".join("--" + f.replace("_", "-") for f in other_hosts)
        raise ConfigError(f"{flags}: with no --devices the plan is for this one host; give --devices too")
    try:
        return describe_cpu(
            memory=args.device_memory_gib * GIB if args.device_memory_gib else None,
            bandwidth=args.memory_bandwidth_gbs * 1e9 if args.memory_bandwidth_gbs else None,
            device_flops=args.device_tflops * 1e12 if args.device_tflops else None,
            link_bandwidth=args.link_gbs * 1e9 if args.link_gbs else None,
            link_latency_us=args.link_latency_us,
            headroom=args.headroom,
            as_cores=args.cpu_cores_as_devices,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _cluster(
    args: argparse.Namespace,
    device: DeviceSpec,
    devices: int,
    per_host: int,
    link: float,
    latency_us: float,
    assumed: list[str],
) -> Cluster:
    try:
        return Cluster(
            device=device,
            devices=devices,
            devices_per_host=per_host,
            link_bandwidth=link,
            link_latency_s=latency_us * 1e-6,
            inter_host_bandwidth=(args.inter_host_gbs or INTER_HOST["gbs"]) * 1e9,
            inter_host_latency_s=INTER_HOST["us"] * 1e-6,
            headroom=args.headroom,
            assumed=tuple(assumed),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from e


def header(
    shape: ModelShape, cluster: Cluster, workload: Workload, profile: str, notes: list[str]
) -> list[str]:
    d = cluster.device
    moe = f", {shape.experts} experts ({shape.active_experts} a token)" if shape.experts else ""
    lines = [
        f"model     {shape.name}: {_count(shape.parameters)} parameters{moe}, {shape.bytes_per_param:g} bytes each "
        f"({shape.weight_bytes / GIB:.2f} GiB); {shape.layers} layers, {shape.heads} heads / {shape.kv_heads} KV heads; "
        f"KV {shape.kv_bytes_per_token / 1024:,.1f} KiB a token; context {shape.context_length:,}",
        f"devices   {cluster.devices} x {d.name} ({d.memory_bytes / GIB:.1f} GiB, {d.flops / 1e12:g} TFLOP/s, "
        f"{d.memory_bandwidth / 1e9:.1f} GB/s), {cluster.devices_per_host} a host; link "
        f"{cluster.link_bandwidth / 1e9:.1f} GB/s, {cluster.link_latency_s * 1e6:g} us; {cluster.headroom:.0%} kept free",
        f"workload  {workload.prompt_tokens}-token prompts, {workload.output_tokens} output tokens; at most "
        f"{workload.max_num_seqs} sequences and {workload.max_num_batched_tokens} tokens a step",
        f"profile   {profile}",
    ]
    return lines + [f"assumed   {a}" for a in cluster.assumed] + [f"note      {n}" for n in notes]


def render(plan: Plan, model: str | None) -> list[str]:
    """The plan as lines; ``model``: the name to put in the ``interlock serve`` line (None: no
    line, a config alone has no weights to serve)."""
    e, s = plan.estimate, plan.split
    role = "aggregated" if s.aggregated else f"{s.prefill} prefill + {s.decode} decode"
    lines = [f"plan      {plan.replicas} x (TP {plan.tensor} x PP {plan.pipeline}), {role}"]
    lines += [f"why       {line}" for line in plan.explanation]
    lines += [
        f"split     {s.why}",
        f"figures   weights {e.weights_per_device / GIB:.2f} GiB + KV {e.kv_per_device / GIB:.2f} GiB a device "
        f"({e.kv_tokens:,} tokens a replica); ITL {e.itl_s * 1e3:.2f} ms alone, step {e.step_s * 1e3:.2f} ms at "
        f"batch {e.batch} ({e.tokens_per_s:,.0f} tokens/s a replica); TTFT {e.ttft_s * 1e3:,.1f} ms; "
        f"fleet {s.fleet_tokens_per_s:,.0f} tokens/s (peaks: real engines reach 60-80% of them)",
    ]
    if s.aggregated and model:
        lines.append(
            f"run       interlock serve --model {model} --workers {plan.replicas} "
            f"--tensor-parallel-size {plan.tensor} --pipeline-parallel-size {plan.pipeline}"
        )
    return lines + ["", "alternatives (best first):"] + table(plan.alternatives)


def table(alternatives: Any) -> list[str]:
    rows = [
        f"{'TP':>3} {'PP':>3} {'repl':>4} {'GiB/dev':>8} {'batch':>5} {'ITL ms':>8} {'TTFT ms':>9} {'fleet tok/s':>11}  why not"
    ]
    for a in alternatives:
        e = a.estimate
        figures = (
            f"{e.weights_per_device / GIB:>8.2f} {e.batch:>5} {e.itl_s * 1e3:>8.2f} {e.ttft_s * 1e3:>9,.1f} "
            f"{e.fleet_tokens_per_s:>11,.0f}"
            if e
            else f"{'-':>8} {'-':>5} {'-':>8} {'-':>9} {'-':>11}"
        )
        rows.append(f"{a.tensor:>3} {a.pipeline:>3} {a.replicas:>4} {figures}  {a.rejected}")
    return rows


def as_json(
    plan: Plan, shape: ModelShape, cluster: Cluster, workload: Workload, notes: list[str]
) -> dict[str, Any]:
    return {
        "plan": dataclasses.asdict(plan),
        "model": dataclasses.asdict(shape),
        "cluster": dataclasses.asdict(cluster),
        "workload": dataclasses.asdict(workload),
        "notes": notes,
    }


def _count(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


if __name__ == "__main__":
    sys.exit(main())
