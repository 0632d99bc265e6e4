"""Short-horizon forecast of arrivals and lengths for the SLA policy.

Holt's linear smoothing (a level and a trend) over the arrival rate seen at each observation,
with a time constant of ``TAU_S`` so that irregular observation intervals weigh the same; prompt
and output lengths are smoothed means (token-weighted over requests). The forecast at
``horizon_s`` is ``level + trend * horizon``, never below zero. The SLA policy sizes for the
larger of the level and the forecast: a falling trend never shrinks the fleet before the load
itself has fallen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interlock.planner.state import Traffic

TAU_S = 30.0
"""Smoothing time constant of the level (the trend's is four times longer)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    rate: float
    """Requests per second expected over the horizon."""
    prompt_tokens: float
    """Mean prompt length."""
    uncached_tokens: float
    """Mean prompt tokens not served from a prefix cache."""
    output_tokens: float


class ArrivalForecaster:
    def __init__(self) -> None:
        self.level: float | None = None
        self.trend = 0.0
        self._isl = 0.0
        self._uncached = 0.0
        self._osl = 0.0
        self._seen = 0

    def observe(self, t: Traffic) -> None:
        if t.duration_s <= 0:
            return
        rate = t.requests / t.duration_s
        a = 1.0 - math.exp(-t.duration_s / TAU_S)
        b = 1.0 - math.exp(-t.duration_s / (4 * TAU_S))
        if self.level is None:
            self.level = rate
        else:
            prev = self.level
            self.level = a * rate + (1 - a) * (prev + self.trend * t.duration_s)
            self.trend = b * (self.level - prev) / t.duration_s + (1 - b) * self.trend
        if t.requests:
            n = t.requests
            w = n / (self._seen + n) if self._seen < 100 else a
            self._isl += w * (t.prompt_tokens / n - self._isl)
            self._uncached += w * ((t.prompt_tokens - t.cached_tokens) / n - self._uncached)
            self._osl += w * (t.output_tokens / n - self._osl)
            self._seen += n

    def forecast(self, horizon_s: float) -> Forecast | None:
        """None until traffic has been seen."""
        if self.level is None or not self._seen:
            return None
        ahead = max(self.level + self.trend * horizon_s, 0.0)
        return Forecast(max(self.level, ahead), self._isl, max(self._uncached, 1.0), self._osl)
