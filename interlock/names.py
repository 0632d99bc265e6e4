"""Names shared by configuration, command line and components: each defined once, here.

A leaf (imports nothing of ours), so the deployment file, every command's flags, the router
and the workers all check against the same tuples.
"""

from __future__ import annotations

ROLES = ("both", "prefill", "decode")
"""Worker roles (``InstanceInfo.role``): ``both`` prefills and decodes its own requests."""

POLICIES = ("kv", "round-robin", "random", "least-loaded", "power-of-two")
"""Base routing policies. Session affinity, route keys and direct pins are per-request overlays
(headers), on top of whichever base policy is chosen."""
UNWEIGHTED_POLICIES = ("round-robin", "random")
"""Policies that ignore routing weights (a planner's ramp needs one of the others)."""

STALL_OVER = ("decoding", "inflight")
"""Whom the ``kv`` cost's stall term counts on a worker (``CostParams.stall_over``): the
requests decoding there, or every request in flight there."""
KV_INDEX_MODES = ("local", "remote")
"""Where a router's KV index is (``routing.kv_index``, ``--kv-index``)."""

DTYPES = ("auto", "bfloat16", "bf16", "float32", "fp32", "float16", "fp16")
"""Model dtypes (``--dtype``): ``auto`` (the default) is bf16 where the machine computes bf16
fast and fp32 where it does not, by measurement (``engine.model.dtype_choice``)."""

ENGINES = ("interlock", "vllm")
"""Engines a worker can run (``--engine``): Interlock's own (with a ``RUNNERS`` runner), or
vLLM's async engine inside the worker process (``interlock.engine.vllm``)."""

RUNNERS = ("torch", "mock")
"""Model runners: the PyTorch model, or the mock with Dynamo's timing model."""

KV_TRANSPORTS = ("inproc", "shm", "tcp")
"""How a destination pulls KV from a source (``interlock.transfer``)."""

TRANSPORTS = ("auto", *KV_TRANSPORTS)
"""A worker's ``cache_transport``: one of the KV transports, or ``auto`` (picked per peer)."""


def policy_name(value: str) -> str:
    """``least_loaded`` and ``least-loaded`` name the same policy."""
    return value.strip().replace("_", "-")
