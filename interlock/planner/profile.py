"""A worker's measured capability, as ``interlock profile`` writes it, and what the SLA policy
derives from it (pure functions).

The file holds raw measurements: prefill seconds against prompt length (one request alone), and
inter-token latency against batch size and context length (decode-only steps). Two small
least-squares fits make them continuous (and extrapolate sensibly past the measured range):

    prefill_s(T) = a + b T + c T^2                  per chunk of at most ``chunk_tokens``
    itl_s(B, L)  = a + b B + c (B L) + d (B L)^2    B requests decoding, L tokens of context each

(the same shapes as the mock runner's step-time model, and the quadratic terms absorb attention
on a real engine).

From them, per worker and for a given mix (mean uncached prompt tokens, output tokens):

* a prefill worker serves one prompt in ``t`` seconds, so up to ``mu = 1 / t`` requests/s; for
  a share ``a`` of requests (the target attainment) to see their first token within the TTFT
  target, it takes ``r = mu + ln(1 - a) / TTFT`` requests/s at most (the time a request spends
  in an M/M/1 queue is exponential with rate ``mu - r``: ``P(T > TTFT) = exp(-(mu - r) TTFT)``);
* a decode worker runs the largest batch ``B`` whose ITL meets the target, and so finishes
  ``B / (osl * itl(B))`` requests/s;
* an aggregated worker does both: prefill takes a share ``rho = r t`` of its time and stretches
  every token by ``1 / (1 - rho)``; its rate is the largest ``r`` (bisection) within the
  prefill bound and meeting the ITL target.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from interlock.errors import ConfigError

PROFILE_VERSION = 1


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    batch: int
    context: int
    itl_s: float


@dataclass(frozen=True)
class CapabilityProfile:
    runner: str
    model: str
    chunk_tokens: int
    """The worker's max_num_batched_tokens (a longer prompt takes several steps)."""
    max_batch: int
    """The worker's max_num_seqs."""
    kv_tokens: int
    """KV capacity in tokens (blocks x block size)."""
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    startup_s: float = 0.0
    """Measured seconds from starting a worker to its engine serving (vLLM: tens of seconds
    eager, minutes when it compiles). The SLA policy forecasts at least this far ahead: an add
    decided now serves only then."""

    def __post_init__(self) -> None:
        if len(self.prefill) < 3 or len(self.decode) < 4:
            raise ConfigError("a capability profile needs >= 3 prefill and >= 4 decode points")
        if self.chunk_tokens < 1 or self.max_batch < 1 or self.kv_tokens < 1:
            raise ConfigError("profile chunk_tokens, max_batch and kv_tokens must be positive")
        if not 0.0 <= self.startup_s < 86_400:
            raise ConfigError("profile startup_s must be in [0, 86400) seconds")

    # ---- the fits ----
    @cached_property
    def _prefill_fit(self) -> tuple[float, float, float]:
        x = np.asarray([p.tokens for p in self.prefill], dtype=float)
        y = np.asarray([p.seconds for p in self.prefill])
        a, b, c = np.linalg.lstsq(np.stack([np.ones_like(x), x, x * x], 1), y, rcond=None)[0]
        return float(a), float(b), float(c)

    @cached_property
    def _decode_fit(self) -> tuple[float, float, float, float]:
        b = np.asarray([p.batch for p in self.decode], dtype=float)
        bl = b * np.asarray([p.context for p in self.decode], dtype=float)
        z = np.asarray([p.itl_s for p in self.decode])
        f = np.linalg.lstsq(np.stack([np.ones_like(b), b, bl, bl * bl], 1), z, rcond=None)[0]
        return float(f[0]), float(f[1]), float(f[2]), float(f[3])

    @cached_property
    def _floor(self) -> float:
        """No fitted time goes below the fastest one measured."""
        return min(min(p.itl_s for p in self.decode), min(p.seconds for p in self.prefill))

    def prefill_s(self, tokens: float) -> float:
        """Seconds to prefill ``tokens`` uncached prompt tokens on an idle worker."""
        a, b, c = self._prefill_fit
        full, rest = divmod(max(tokens, 1.0), self.chunk_tokens)
        one = a + b * self.chunk_tokens + c * self.chunk_tokens**2
        tail = a + b * rest + c * rest * rest if rest else 0.0
        return max(full * one + tail, self._floor)

    def itl_s(self, batch: float, context: float) -> float:
        a, b, c, d = self._decode_fit
        bl = batch * context
        return max(a + b * batch + c * bl + d * bl * bl, self._floor)

    # ---- capacities (requests/s per worker) ----
    def prefill_rate(self, uncached: float, ttft_s: float, attainment: float) -> float:
        t = self.prefill_s(uncached)
        return max(0.0, 1.0 / t + math.log(1.0 - attainment) / ttft_s)

    def decode_batch(self, context: float, itl_target_s: float) -> int:
        """Largest batch whose ITL meets the target (0 if not even one), within KV capacity."""
        hi = min(self.max_batch, max(int(self.kv_tokens // max(context, 1.0)), 0))
        lo = 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.itl_s(mid, context) <= itl_target_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def decode_rate(self, prompt: float, output: float, itl_target_s: float) -> float:
        ctx = prompt + output / 2
        b = self.decode_batch(ctx, itl_target_s)
        return b / (max(output, 1.0) * self.itl_s(b, ctx)) if b else 0.0

    def aggregated_rate(
        self,
        prompt: float,
        uncached: float,
        output: float,
        ttft_s: float,
        itl_target_s: float,
        attainment: float,
        *,
        prefill_s: float | None = None,
    ) -> float:
        """Requests/s one worker both prefills and decodes within the targets (module
        docstring). ``prefill_s``: the mean prefill seconds per request, measured over recent
        requests; the TTFT target is then left out here (the SLA policy sizes the pool for it
        with ``planner.queueing``, which sees the spread of prompts and of arrivals) and the
        rate is the ITL target's alone, prefill taking its share of the worker's time."""
        if prefill_s is None:
            t = self.prefill_s(uncached)
            top = self.prefill_rate(uncached, ttft_s, attainment)
        else:
            t, top = prefill_s, math.inf
        ctx = prompt + output / 2

        def feasible(r: float) -> bool:
            rho = r * t
            if r > top or rho >= 1.0:
                return False
            batch = 1.0
            for _ in range(30):  # Little's law: batch = rate x time decoding
                batch = r * max(output, 1.0) * self.itl_s(batch, ctx) / (1.0 - rho)
            return (
                batch <= self.max_batch
                and batch * ctx <= self.kv_tokens
                and self.itl_s(batch, ctx) / (1.0 - rho) <= itl_target_s
            )

        lo, hi = 0.0, 1.0 / t
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if feasible(mid) else (lo, mid)
        return lo

    # ---- file ----
    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        d["version"] = PROFILE_VERSION
        return json.dumps(d, indent=1)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


def needed(rate: float, per_worker: float) -> float:
    """Workers needed for ``rate`` at ``per_worker`` requests/s each (inf when none can)."""
    if rate <= 0:
        return 0.0
    return rate / per_worker if per_worker > 0 else math.inf


def load_profile(path: str | Path) -> CapabilityProfile:
    """Read a profile file, naming what is wrong with it."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"capability profile {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"capability profile {path}: not JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("version") != PROFILE_VERSION:
        raise ConfigError(f"capability profile {path}: expected version {PROFILE_VERSION}")
    try:
        return CapabilityProfile(
            runner=str(raw["runner"]),
            model=str(raw["model"]),
            chunk_tokens=int(raw["chunk_tokens"]),
            max_batch=int(raw["max_batch"]),
            kv_tokens=int(raw["kv_tokens"]),
            prefill=tuple(PrefillPoint(int(p["tokens"]), float(p["seconds"])) for p in raw["prefill"]),
            decode=tuple(
                DecodePoint(int(p["batch"]), int(p["context"]), float(p["itl_s"])) for p in raw["decode"]
            ),
            startup_s=float(raw.get("startup_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"capability profile {path}: missing or bad field ({e!r})") from None
