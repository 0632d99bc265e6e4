"""The only module that reads environment variables. Read once, typed, frozen."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Env:
    cache_dir: Path
    """Where converted models live (INTERLOCK_CACHE_DIR, default ~/.cache/interlock)."""
    log_level: str
    """INTERLOCK_LOG_LEVEL, default INFO."""
    log_format: str
    """INTERLOCK_LOG_FORMAT: "text" (default) or "json" (one object per line)."""
    num_threads: int
    """INTERLOCK_NUM_THREADS: torch intra-op threads; 0 means all cores."""
    nats_url: str | None
    """INTERLOCK_NATS_URL: default NATS server for workers and frontends."""
    omp_wait_policy: str
    """OMP_WAIT_POLICY handed to worker processes; unset by default (see ``gomp_spincount``)."""
    gomp_spincount: str
    """GOMP_SPINCOUNT handed to worker processes, default 10000: an idle OpenMP thread spins
    about that many turns (tens of microseconds) before it sleeps. Between the kernels of one
    step that saves a wake-up per kernel (PASSIVE, no spinning, was 10-30% slower on an idle
    machine); between steps it sleeps, so workers sharing cores do not starve each other
    (torch's default, long spinning, was 10-20x slower on a busy 2-core machine)."""
    api_keys: tuple[str, ...]
    """INTERLOCK_API_KEYS: comma-separated API keys the frontend accepts (beside --api-key)."""
    linear_kernel: str
    """INTERLOCK_LINEAR_KERNEL: "auto" (default: each layer's kernel per row count, measured once
    on this machine), or "small", "onednn", "torch" everywhere."""
    attention_kernel: str
    """INTERLOCK_ATTENTION_KERNEL: "auto" (default: per decode batch / prefill chunk length,
    measured once on this machine), or "fused", "torch" everywhere."""
    elementwise_kernel: str
    """INTERLOCK_ELEMENTWISE_KERNEL: the same for the norms, SwiGLU and rotary ("auto", "fused",
    "torch")."""
    cpu_kernels: bool
    """INTERLOCK_CPU_KERNELS: use the compiled fused bf16 CPU kernels where the CPU has
    AVX-512 BF16, and the KV block-copy kernel (default 1); 0 keeps the plain PyTorch path and
    numpy block copies."""
    cluster_secret: bytes | None = field(default=None, repr=False)
    """INTERLOCK_CLUSTER_SECRET: shared by every process of a deployment; request-plane and
    KV-transfer peers prove they know it (``serve`` hands its children one it generated)."""
    nats_user: str | None = None
    """INTERLOCK_NATS_USER (with INTERLOCK_NATS_PASSWORD): NATS login."""
    nats_password: str | None = field(default=None, repr=False)
    nats_token: str | None = field(default=None, repr=False)
    """INTERLOCK_NATS_TOKEN: NATS token login."""
    tracing: bool = False
    """INTERLOCK_TRACING: OpenTelemetry traces on (``metrics.tracing``; ``--tracing``)."""
    otlp_protocol: str | None = None
    """Where traces go: "http/protobuf" or "grpc" (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL) when
    OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; None: stderr."""

    @property
    def kernels(self) -> dict[str, str]:
        """The kernel choice per family (``engine.model.dispatch.FAMILIES``)."""
        return {
            "linear": self.linear_kernel,
            "attention": self.attention_kernel,
            "elementwise": self.elementwise_kernel,
        }


@cache
def get_env() -> Env:
    cache_dir = os.environ.get("INTERLOCK_CACHE_DIR") or str(Path.home() / ".cache" / "interlock")
    return Env(
        cache_dir=Path(cache_dir),
        log_level=os.environ.get("INTERLOCK_LOG_LEVEL", "INFO").upper(),
        log_format=os.environ.get("INTERLOCK_LOG_FORMAT", "text").strip().lower() or "text",
        num_threads=int(os.environ.get("INTERLOCK_NUM_THREADS", "0") or 0),
        nats_url=os.environ.get("INTERLOCK_NATS_URL") or None,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", ""),
        gomp_spincount=os.environ.get("GOMP_SPINCOUNT") or "10000",
        api_keys=tuple(k.strip() for k in os.environ.get("INTERLOCK_API_KEYS", "").split(",") if k.strip()),
        linear_kernel=_choice("INTERLOCK_LINEAR_KERNEL"),
        attention_kernel=_choice("INTERLOCK_ATTENTION_KERNEL"),
        elementwise_kernel=_choice("INTERLOCK_ELEMENTWISE_KERNEL"),
        cpu_kernels=os.environ.get("INTERLOCK_CPU_KERNELS", "1").strip().lower()
        not in ("0", "false", "no", "off"),
        cluster_secret=os.environ.get("INTERLOCK_CLUSTER_SECRET", "").strip().encode() or None,
        nats_user=os.environ.get("INTERLOCK_NATS_USER") or None,
        nats_password=os.environ.get("INTERLOCK_NATS_PASSWORD") or None,
        nats_token=os.environ.get("INTERLOCK_NATS_TOKEN") or None,
        tracing=os.environ.get(TRACING_VAR, "").strip().lower() in ("1", "true", "yes", "on"),
        otlp_protocol=_otlp_protocol(),
    )


def _otlp_protocol() -> str | None:
    env = os.environ
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (protocol or "http/protobuf").strip().lower()


def _choice(name: str) -> str:
    return os.environ.get(name, "auto").strip().lower() or "auto"


CLUSTER_SECRET_VAR = "INTERLOCK_CLUSTER_SECRET"
LOG_FORMAT_VAR = "INTERLOCK_LOG_FORMAT"
TRACING_VAR = "INTERLOCK_TRACING"
NATS_USER_VAR = "INTERLOCK_NATS_USER"
NATS_PASSWORD_VAR = "INTERLOCK_NATS_PASSWORD"
NATS_TOKEN_VAR = "INTERLOCK_NATS_TOKEN"
"""Names a parent uses to hand these to its children (``serve`` -> ``worker``)."""


@cache
def flag_environment() -> dict[str, str]:
    """Every ``INTERLOCK_*`` variable, for command-line flags' defaults (``cli.flags``)."""
    return {k: v for k, v in os.environ.items() if k.startswith("INTERLOCK_")}
