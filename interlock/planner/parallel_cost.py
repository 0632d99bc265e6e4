"""The placement optimizer's cost model: a roofline per pass, plus what each cut costs.

A forward pass through one replica of ``T x P`` devices (``T`` tensor ranks in each of ``P``
pipeline stages):

* Each device holds ``1/(T*P)`` of the weights. A stage's time on one micro-batch is the
  roofline's: the larger of its FLOPs over the device's compute and its bytes (the weights it
  reads, and the KV it attends over) over the memory bandwidth. Decode reads every weight for a
  few tokens, so it is bound by bytes; a long prefill by FLOPs. A mixture of experts reads only
  the experts its tokens were routed to (``ModelShape.bytes_read``) and computes with the
  active ones.
* Tensor parallelism adds two all-reduces per layer (after attention, after the MLP), each a
  latency plus ``2(T-1)/T`` of the hidden states over the link (a ring): a host's link unless
  the T ranks span hosts.
* Pipeline parallelism passes hidden states once per stage, and a step is cut into up to P
  micro-batches that flow through the stages, the step waiting for the last (Interlock's engine,
  ``engine.parallel.micro``): ``(m + P - 1)`` stage times for ``m`` micro-batches, each of
  which reads the stage's weights again. One sequence alone (an ITL at batch 1, one prompt's
  prefill) is one micro-batch: the stages give it no speed, only memory.

Memory: each device holds its share of the weights and of every token's KV (KV heads cut as the
engine cuts them: unevenly where T does not divide them, one per rank where T exceeds them),
keeps the cluster's ``headroom`` free, and must hold one full-length sequence's KV; the rest is
the KV budget. A replica's batch is the mean requests that budget holds, at most
``max_num_seqs``.

A fleet of R aggregated replicas serves ``R / (prompt / prefill rate + output * step / batch)``
requests a second: each request takes its prefill's and its decode's share of a replica.

The figures are peaks (real engines reach maybe 60-80% of the bandwidth roofline; the page
docs/partitioning.md compares them with published measurements): they rank layouts, they do not
promise numbers. Not modelled: overlap of communication with compute, kernel efficiency at small
batches, vocabulary-parallel embeddings (all weights are taken as evenly cut), expert
parallelism (experts are cut by TP like a dense MLP), prefix-cache hits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.planner.parallel_shapes import GIB, Cluster, ModelShape, Workload


@dataclass(frozen=True, slots=True)
class Estimate:
    """One layout's figures: memory per device, step times, throughput (all peaks)."""

    tensor: int
    pipeline: int
    replicas: int
    weights_per_device: float
    """Bytes."""
    kv_per_device: float
    """Bytes of KV budget left on each device."""
    kv_tokens: int
    """Tokens of KV one replica holds."""
    batch: int
    """Mean requests one replica runs at once (KV budget and ``max_num_seqs`` allowing)."""
    itl_s: float
    """A decode step with one sequence alone (the mean context)."""
    step_s: float
    """A decode step at ``batch``."""
    ttft_s: float
    """The mean prompt's prefill alone."""
    prefill_tokens_per_s: float
    """One replica, prompts packed into steps of ``max_num_batched_tokens``."""
    fleet_tokens_per_s: float
    """Output tokens a second of all replicas, each prefilling and decoding (aggregated)."""
    prefill_share: float
    """Fraction of an aggregated replica's time spent in prefill."""
    latency_s: float
    """The mean request alone: TTFT plus its output tokens at ``itl_s``."""

    @property
    def ranks(self) -> int:
        return self.tensor * self.pipeline

    @property
    def tokens_per_s(self) -> float:
        """One replica's decode output at ``batch``."""
        return self.batch / self.step_s


def kv_share(shape: ModelShape, tensor: int, pipeline: int) -> float:
    """The fraction of one token's KV that the busiest device holds."""
    heads = math.ceil(shape.kv_heads / tensor) if tensor <= shape.kv_heads else 1
    return heads / shape.kv_heads / pipeline


def kv_budget(shape: ModelShape, cluster: Cluster, tensor: int, pipeline: int) -> tuple[float, str]:
    """Bytes of KV each device can hold, and why the layout does not fit ("": it fits)."""
    weights = shape.weight_bytes / (tensor * pipeline)
    usable = cluster.device.memory_bytes * (1 - cluster.headroom)
    one = shape.context_length * shape.kv_bytes_per_token * kv_share(shape, tensor, pipeline)
    left = usable - weights
    if left >= one:
        return left, ""
    return left, (
        f"does not fit: {weights / GIB:.1f} GiB of weights + {one / GIB:.2f} GiB of KV for one "
        f"{shape.context_length}-token sequence > {usable / GIB:.1f} GiB usable a device"
    )


def estimate(
    shape: ModelShape, cluster: Cluster, tensor: int, pipeline: int, replicas: int, workload: Workload
) -> Estimate:
    """The figures of ``replicas`` replicas of ``tensor x pipeline``; the layout must fit."""
    kv_bytes, why = kv_budget(shape, cluster, tensor, pipeline)
    assert not why, why
    kv_tokens = int(kv_bytes / (shape.kv_bytes_per_token * kv_share(shape, tensor, pipeline)))
    per_seq = min(workload.sequence_tokens, shape.context_length)
    batch = max(1, min(workload.max_num_seqs, kv_tokens // per_seq))
    context = workload.prompt_tokens + workload.output_tokens // 2

    def run(seqs: int, new: int, ctx: int) -> float:
        return pass_s(shape, cluster, tensor, pipeline, seqs=seqs, new=new, context=ctx)

    step, itl = run(batch, 1, context), run(1, 1, context)
    ttft = run(1, workload.prompt_tokens, 0)
    packed = max(1, workload.max_num_batched_tokens // workload.prompt_tokens)
    prefill_rate = packed * workload.prompt_tokens / run(packed, workload.prompt_tokens, 0)
    prefill_s = workload.prompt_tokens / prefill_rate
    request_s = prefill_s + workload.output_tokens * step / batch
    return Estimate(
        tensor=tensor,
        pipeline=pipeline,
        replicas=replicas,
        weights_per_device=shape.weight_bytes / (tensor * pipeline),
        kv_per_device=kv_bytes,
        kv_tokens=kv_tokens,
        batch=batch,
        itl_s=itl,
        step_s=step,
        ttft_s=ttft,
        prefill_tokens_per_s=prefill_rate,
        fleet_tokens_per_s=replicas * workload.output_tokens / request_s,
        prefill_share=prefill_s / request_s,
        latency_s=ttft + workload.output_tokens * itl,
    )


def pass_s(
    shape: ModelShape, cluster: Cluster, tensor: int, pipeline: int, *, seqs: int, new: int, context: int
) -> float:
    """One forward pass: ``seqs`` sequences each adding ``new`` tokens after ``context`` tokens
    of KV, through up to ``pipeline`` micro-batches (module note)."""
    micro = max(1, min(pipeline, seqs))
    stage = stage_s(shape, cluster, tensor, pipeline, seqs=seqs / micro, new=new, context=context)
    return (micro + pipeline - 1) * stage


def stage_s(
    shape: ModelShape, cluster: Cluster, tensor: int, pipeline: int, *, seqs: float, new: int, context: int
) -> float:
    """One stage's time on one micro-batch: roofline, all-reduces, the hop to the next stage."""
    ranks = tensor * pipeline
    tokens = seqs * new
    attention = 4 * shape.layers * shape.heads * shape.head_dim * tokens * (context + new / 2)
    flops = (2 * shape.active_parameters * tokens + attention) / ranks
    kv = seqs * (context + new) * shape.kv_bytes_per_token * kv_share(shape, tensor, pipeline)
    read = shape.bytes_read(tokens) / ranks + kv
    device = cluster.device
    compute = max(flops / device.flops, read / device.memory_bandwidth)
    hidden = tokens * shape.hidden * shape.activation_bytes
    reduces = 2 * (shape.layers / pipeline) * allreduce_s(cluster, tensor, hidden)
    bandwidth, latency = cluster.link(ranks)
    hop = latency + hidden / bandwidth if pipeline > 1 else 0.0
    return compute + reduces + hop


def allreduce_s(cluster: Cluster, tensor: int, nbytes: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``tensor`` ranks: a latency, ``2(T-1)/T`` of the bytes."""
    if tensor == 1:
        return 0.0
    bandwidth, latency = cluster.link(tensor)
    return latency + 2 * (tensor - 1) / tensor * nbytes / bandwidth


__all__ = ["Estimate", "allreduce_s", "estimate", "kv_budget", "kv_share", "pass_s", "stage_s"]
