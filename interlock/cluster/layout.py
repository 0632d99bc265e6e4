"""This host described for the placement optimizer, and the layout an execution group's
``optimization_profile`` gets on it (``planner.parallel_plan`` decides; this module measures
and reads what it decides from).

A CPU host is one device by default: its cores serve one worker's model as that worker's
threads. Measured on a 2-core Intel Xeon (BENCHMARKS.md, "Tensor and pipeline parallelism"),
SmolLM2 decoded 1.3x faster as one process of 2 threads than as 2 tensor-parallel ranks of
one thread, and prefilled 1.4x faster: threads share the memory and cost no all-reduce. So on
one CPU host the optimizer only ever picks ``T = P = 1``; ranks pay off across sockets or
hosts, or on accelerators. ``as_cores=True`` describes the cores as separate devices instead
(what ``interlock plan --cpu-cores-as-devices`` shows, to compare).

A CUDA host is its visible devices, their memory read from the driver; their compute and
bandwidth are an H100's unless given (said under ``assumed``).
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

from interlock.deploy import ExecutionGroup
from interlock.errors import ConfigError
from interlock.planner.parallel_plan import (
    CanCut,
    Cluster,
    DeviceSpec,
    ModelShape,
    Pins,
    Plan,
    Workload,
    any_cut,
    choose,
)
from interlock.planner.parallel_shapes import GIB

CPU_CORE_GFLOPS = 200.0
"""A core's bf16 matmul rate, assumed: Interlock's kernels reached ~210 GFLOP/s a core in prefill
on a Zen 4 (BENCHMARKS.md, "Engine on CPU")."""
CPU_LINK_US = 38.0
"""The shared-memory all-reduce's latency between ranks on cores (``engine.parallel.comm``:
measured for one decode row on the 2-core Xeon, most of it Python)."""
H100 = {"tflops": 989.0, "bandwidth_gbs": 3350.0, "link_gbs": 450.0, "link_us": 10.0}
"""An H100 SXM's figures (bf16 dense, HBM3, NVLink), assumed where a device's are not given."""
INTER_HOST = {"gbs": 50.0, "us": 25.0}
"""One 400 Gb/s NIC a device, and a cross-host collective's latency."""


def host_memory() -> float:
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def measure_copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 4) -> float:
    """Bytes/s of one thread copying ``nbytes`` (read + write), the best of ``repeats`` after
    one warm-up copy (which pays the page faults)."""
    import numpy as np

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def describe_cpu(
    *,
    memory: float | None = None,
    bandwidth: float | None = None,
    device_flops: float | None = None,
    link_bandwidth: float | None = None,
    link_latency_us: float | None = None,
    headroom: float = 0.1,
    as_cores: bool = False,
) -> Cluster:
    """This CPU host (module note); a figure given replaces what is measured or assumed
    (``device_flops``: one device's, the whole host's or one core's with ``as_cores``)."""
    cores = len(os.sched_getaffinity(0))
    devices = cores if as_cores else 1
    assumed = []
    if memory is None:
        memory = host_memory() / devices
        assumed.append(
            f"memory: the host's {host_memory() / GIB:.1f} GiB"
            + (f" shared by {cores} cores" if as_cores else "")
        )
    if bandwidth is None:
        bandwidth = measure_copy_bandwidth()
        assumed.append(
            f"memory bandwidth {bandwidth / 1e9:.1f} GB/s a device: a one-thread copy measured now"
        )
    if device_flops is None:
        device_flops = CPU_CORE_GFLOPS * 1e9 * (1 if as_cores else cores)
        assumed.append(f"compute {CPU_CORE_GFLOPS:g} GFLOP/s a core (Interlock's bf16 kernels on a Zen 4)")
    if link_latency_us is None:
        link_latency_us = CPU_LINK_US
        assumed.append(f"all-reduce latency {CPU_LINK_US:g} us (shared memory, engine.parallel.comm)")
    if not as_cores:
        assumed.append(f"one device: the {cores} cores are one worker's threads (faster than ranks here)")
    device = DeviceSpec(
        int(memory), device_flops, bandwidth, "cpu core" if as_cores else f"cpu ({cores} cores)"
    )
    return Cluster(
        device=device,
        devices=devices,
        devices_per_host=devices,
        link_bandwidth=link_bandwidth or bandwidth,
        link_latency_s=link_latency_us * 1e-6,
        inter_host_bandwidth=INTER_HOST["gbs"] * 1e9,
        inter_host_latency_s=INTER_HOST["us"] * 1e-6,
        headroom=headroom,
        assumed=tuple(assumed),
    )


def describe_cuda() -> Cluster:
    """This host's visible CUDA devices (module note)."""
    import torch

    count = torch.cuda.device_count()
    if count < 1:
        raise ConfigError("device cuda: no CUDA device is visible on this host")
    props = torch.cuda.get_device_properties(0)
    device = DeviceSpec(
        int(props.total_memory), H100["tflops"] * 1e12, H100["bandwidth_gbs"] * 1e9, props.name
    )
    return Cluster(
        device=device,
        devices=count,
        devices_per_host=count,
        link_bandwidth=H100["link_gbs"] * 1e9,
        link_latency_s=H100["link_us"] * 1e-6,
        inter_host_bandwidth=INTER_HOST["gbs"] * 1e9,
        inter_host_latency_s=INTER_HOST["us"] * 1e-6,
        assumed=(f"compute, bandwidth and links of an H100 SXM for {props.name}",),
    )


def model_shape(config: Path, name: str) -> tuple[ModelShape, CanCut, list[str]]:
    """The shape of the model whose ``config.json`` is ``config``, the engine's rule for
    cutting it, and notes on what could not be read (then no cut is refused)."""
    from interlock.engine.model.config import ModelArchConfig
    from interlock.engine.model.partition import check_sizes

    try:
        raw = json.loads(config.read_text())
        shape = ModelShape.from_hf_config(raw, name=name)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"cannot read the model's shape from {config}: {e}") from e
    try:
        return shape, partial(check_sizes, ModelArchConfig.from_dict(raw)), []
    except ConfigError as e:
        return shape, any_cut, [f"Interlock's engine cannot load it ({e.message}): no cut refused"]


def choose_layout(g: ExecutionGroup, folder: Path, cluster: Cluster | None = None) -> Plan:
    """The layout ``g.optimization_profile`` asks for on this host (``cluster``: another one);
    sizes other than 1 that ``g`` sets are pins."""
    assert g.optimization_profile is not None
    shape, can_cut, _ = model_shape(folder / "config.json", folder.name)
    pins = Pins(
        g.tensor_parallel_size if g.tensor_parallel_size != 1 else None,
        g.pipeline_parallel_size if g.pipeline_parallel_size != 1 else None,
        None,
    )
    if cluster is None and g.device.startswith("cuda"):
        cluster = describe_cuda()
    elif cluster is None:  # ranks pinned on a CPU: its cores are their devices
        cluster = describe_cpu(as_cores=pins.tensor is not None or pins.pipeline is not None)
    return choose(
        shape, cluster, profile=g.optimization_profile, workload=Workload(), can_cut=can_cut, pins=pins
    )
