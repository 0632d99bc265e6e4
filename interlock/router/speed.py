"""Each worker's measured speed as a line: ``step_s = overhead_s + tokens * per_token_s``.

Why a line and not the engine's "prefill tokens per second": tokens/s measured per step depends
on the step's size (a fixed per-step cost, including the decodes that share it, is spread over
more tokens in a big step). A worker that happens to batch big chunks looks faster, attracts
more work, batches bigger chunks, and looks faster still: herding through the speed estimate.
Fitting the line to the (step time, tokens computed) pairs of the load reports separates the
per-step cost from the per-token cost, so a request of ``n`` tokens is priced the same way on
every worker of the same speed.

Least squares with exponential forgetting (``decay`` per report), so the fit follows a worker
whose speed changes. A fit needs a spread of step sizes; until then ``estimate`` is None and
the caller falls back to the fleet's median fit, then to defaults. The same fit serves for
decode step time against KV usage, pooled over the fleet (``LoadTracker.decode_step``).
"""

from __future__ import annotations


class StepTimeFit:
    __slots__ = ("decay", "n", "st", "sy", "stt", "sty")

    def __init__(self, decay: float = 0.97) -> None:
        self.decay = decay
        self.n = self.st = self.sy = self.stt = self.sty = 0.0

    def add(self, tokens: float, step_s: float) -> None:
        d = self.decay
        self.n = self.n * d + 1.0
        self.st = self.st * d + tokens
        self.sy = self.sy * d + step_s
        self.stt = self.stt * d + tokens * tokens
        self.sty = self.sty * d + tokens * step_s

    def estimate(self, min_spread_tokens: float = 64.0) -> tuple[float, float] | None:
        """``(intercept, slope)`` (``(overhead_s, per_token_s)`` for step times), or None while
        the x values seen are too alike (standard deviation under ``min_spread_tokens``)."""
        if self.n < 3:
            return None
        mt, my = self.st / self.n, self.sy / self.n
        var = self.stt / self.n - mt * mt
        if var < min_spread_tokens * min_spread_tokens:
            return None
        b = (self.sty / self.n - mt * my) / var
        if b <= 0:
            return None
        return max(my - b * mt, 0.0), b
