"""Conditional disaggregation: prefill this request on a prefill worker, or on its decode worker?

Pure: plain values in, a ``DisaggChoice`` out. Estimated time to first token each way::

    prefill_time(w) = work / prefill_tokens_per_s(w)                 work = queued + uncached
                    + ceil(work / chunk_tokens) * decode_step_s(w)    if w is decoding: each
                                                                      prefill step carries its batch
    local  = prefill_time(decode worker)
    remote = prefill_time(prefill worker) + rtt + kv_bytes / bandwidth

Go remote only when ``remote < local``. Stay local, whatever the times, when the request's KV is
larger than ``max_kv_bytes``, when the decode worker lacks the free blocks to receive it, when
the link failed its last check, or when no prefill worker is alive. With ``enforce`` every
request goes remote unless one of those holds, and then it fails (the caller answers 503); a
prefill pool that is only busy is waited for in the router's queue (``disagg_flow``).

Why the decode worker's running batch is charged: on a worker that decodes, a long prefill
stretches every step of the batch (that is the reason to disaggregate at all); its own TTFT is
the prefill plus one decode step's worth of work per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS
from interlock.errors import ConfigError

STAY_REASONS = ("no_prefill_worker", "kv_too_large", "no_free_blocks", "link_failed")
"""Reasons that keep a request local whatever the times (``enforce`` fails it instead)."""
REASONS = ("remote_faster", "enforced", "local_faster", *STAY_REASONS, "prompt_logprobs")
"""Every reason counted; ``prompt_logprobs`` is decided before ``choose`` (``disagg_flow``)."""


@dataclass(frozen=True)
class DisaggConfig:
    enabled: bool = True
    """False: never prefill remotely (aggregated serving even with prefill workers around)."""
    enforce: bool = False
    """Always prefill remotely; a request that cannot is failed, not served locally."""
    max_kv_bytes: int = 1 << 30
    default_bandwidth_bytes_per_s: float = 1e9
    """Link figures used before the first measurement."""
    default_rtt_s: float = 1e-3
    default_prefill_tokens_per_s: float = 1000.0
    """Prefill speed assumed for a worker that has not reported one yet."""
    chunk_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    """Workers' prefill budget per step (max_num_batched_tokens)."""
    link_check_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_kv_bytes < 0 or self.chunk_tokens < 1:
            raise ConfigError("max_kv_bytes must be >= 0 and chunk_tokens positive")
        if min(self.default_bandwidth_bytes_per_s, self.default_prefill_tokens_per_s) <= 0:
            raise ConfigError("default bandwidth and prefill speed must be positive")


@dataclass(frozen=True, slots=True)
class WorkerEstimate:
    """What the router knows of one worker (its last load report, the KV index's overlap)."""

    worker_id: str
    queued_prefill_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    cached_tokens: int = 0
    """Prompt tokens this worker already holds (prefix hit)."""
    free_blocks: int = 0
    num_running: int = 0
    decode_step_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    bandwidth_bytes_per_s: float
    rtt_s: float
    ok: bool = True
    """False when the last link check failed."""

    def transfer_time_s(self, nbytes: int) -> float:
        return self.rtt_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class DisaggChoice:
    remote: bool
    reason: str
    local_ttft_s: float = 0.0
    remote_ttft_s: float = 0.0

    def log_line(self, request_id: str) -> str:
        side = "remote" if self.remote else "local"
        return (
            f"prefill {request_id} {side} ({self.reason}): "
            f"local~{self.local_ttft_s * 1e3:.1f}ms remote~{self.remote_ttft_s * 1e3:.1f}ms"
        )


def prefill_time_s(w: WorkerEstimate, prompt_tokens: int, config: DisaggConfig) -> float:
    """Estimated seconds until ``w`` has computed the prompt (queue first)."""
    work = w.queued_prefill_tokens + max(prompt_tokens - w.cached_tokens, 1)
    t = work / (w.prefill_tokens_per_s or config.default_prefill_tokens_per_s)
    if w.num_running:
        t += math.ceil(work / config.chunk_tokens) * w.decode_step_s
    return t


def choose(
    *,
    prompt_tokens: int,
    kv_bytes: int,
    blocks_needed: int,
    decode: WorkerEstimate,
    prefill: WorkerEstimate | None,
    link: LinkEstimate | None,
    config: DisaggConfig,
) -> DisaggChoice:
    """Remote or local prefill for one request (see the module docstring)."""
    local = prefill_time_s(decode, prompt_tokens, config)
    stay = _hard_stay(kv_bytes, blocks_needed, decode, prefill, link, config)
    if stay is not None or prefill is None:
        return DisaggChoice(False, stay or "no_prefill_worker", local, math.inf)
    link = link or LinkEstimate(config.default_bandwidth_bytes_per_s, config.default_rtt_s)
    remote = prefill_time_s(prefill, prompt_tokens, config) + link.transfer_time_s(kv_bytes)
    if config.enforce:
        return DisaggChoice(True, "enforced", local, remote)
    if remote < local:
        return DisaggChoice(True, "remote_faster", local, remote)
    return DisaggChoice(False, "local_faster", local, remote)


def _hard_stay(
    kv_bytes: int,
    blocks_needed: int,
    decode: WorkerEstimate,
    prefill: WorkerEstimate | None,
    link: LinkEstimate | None,
    config: DisaggConfig,
) -> str | None:
    if prefill is None:
        return "no_prefill_worker"
    if kv_bytes > config.max_kv_bytes:
        return "kv_too_large"
    if decode.free_blocks < blocks_needed:
        return "no_free_blocks"
    if link is not None and not link.ok:
        return "link_failed"
    return None
