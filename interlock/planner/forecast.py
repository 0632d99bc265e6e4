"""Short-horizon forecast of arrivals and lengths for the SLA policy.

Holt's linear smoothing (a level and a trend) over the arrival rate seen at each observation,
with a time constant of ``TAU_S`` so that irregular observation intervals weigh the same; prompt
and output lengths are smoothed means (token-weighted over requests). The forecast at
``horizon_s`` is ``level + trend * horizon``, never below zero. The SLA policy sizes for the
larger of the level and the forecast: a falling trend never shrinks the fleet before the load
itself has fallen.

Level shifts: Holt's trend reads a step in the arrivals as a steep ramp. While the level
catches up with a step (a few ``TAU_S``), each observation raises it, the trend learns that
rise, the level (which adds the trend) passes the new rate and the forecast ``horizon_s``
ahead passes it by far more: after a x6 step a pool sized for 7 workers was asked for 10. So
when the arrivals of the last ``SHIFT_S`` come at least ``SHIFT`` times as fast as the level
(or at most ``1 / SHIFT`` times) and differ from what the level expects by more than
``SHIFT_SIGMAS`` Poisson deviations (a handful of requests a second jumps 1.5x by chance), the
trend is set to zero and learns nothing for
``SHIFT_HOLD_S`` after the last such observation: the level then follows the step as a plain
smoothed mean (no overshoot, no undershoot after a drop), and the trend starts again from the
level's own slope once it has caught up. A day's rise or fall never comes near ``SHIFT`` (the
10 s arrivals of the Mooncake day stay within 1.4x of the level), so ramps keep their trend.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from interlock.planner.state import Traffic

TAU_S = 30.0
"""Smoothing time constant of the level (the trend's is four times longer)."""

SHIFT_S = 10.0
"""Arrivals over the last this many seconds are the recent rate (level shifts, surges)."""

SHIFT = 1.5
"""A recent rate at least this many times the level (or at most its inverse) is a level shift."""

SHIFT_SIGMAS = 4.0
"""...and by at least this many standard deviations of a Poisson count at the level."""

SHIFT_HOLD_S = 3 * TAU_S
"""After a level shift the trend stays at zero this long (the level is then within 5% of a
step's new rate)."""


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
        self.recent = 0.0
        """Arrival rate over the last ``SHIFT_S`` (no smoothing, no trend)."""
        self._recent: deque[tuple[float, float, int]] = deque()
        """(clock, seconds, arrivals) of the observations within the last ``SHIFT_S``."""
        self._clock = 0.0
        """Seconds observed so far (the sum of the observations' durations)."""
        self._shift_until = -math.inf
        self._isl = 0.0
        self._uncached = 0.0
        self._osl = 0.0
        self._seen = 0

    def shifting(self) -> bool:
        """True while the trend is held at zero after a level shift."""
        return self._clock < self._shift_until

    def rising(self) -> bool:
        """Arrivals rising: a positive trend, or the level still catching up with a step up."""
        return self.trend > 0 or (self.shifting() and self.recent > (self.level or 0.0))

    def _is_shift(self, level: float) -> bool:
        span = sum(d for _, d, _ in self._recent)
        expected, seen = level * span, self.recent * span
        far = abs(seen - expected) > SHIFT_SIGMAS * math.sqrt(max(expected, 1.0))
        return far and not 1 / SHIFT < self.recent / level < SHIFT

    def observe(self, t: Traffic) -> None:
        if t.duration_s <= 0:
            return
        self._clock += t.duration_s
        self._recent.append((self._clock, t.duration_s, t.requests))
        while self._recent[0][0] <= self._clock - SHIFT_S:
            self._recent.popleft()
        self.recent = sum(n for _, _, n in self._recent) / sum(d for _, d, _ in self._recent)
        rate = t.requests / t.duration_s
        a = 1.0 - math.exp(-t.duration_s / TAU_S)
        b = 1.0 - math.exp(-t.duration_s / (4 * TAU_S))
        if self.level is None:
            self.level = rate
        else:
            prev = self.level
            self.level = a * rate + (1 - a) * (prev + self.trend * t.duration_s)
            if self.level > 0 and self._is_shift(self.level):
                self._shift_until = self._clock + SHIFT_HOLD_S
            if self.shifting():
                self.trend = 0.0
            else:
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
