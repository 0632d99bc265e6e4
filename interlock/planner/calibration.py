"""What the SLA policy learns of its own errors: the capacity model's against what happened, and
the forecast's against the arrivals that came.

**Capacity error.** The model says a pool of ``n`` workers serves the forecast within the
targets when its need ``r <= n``. Each whole window at one size (no worker starting, the size
not changed in the window before either: a backlog left by a change is not the model's fault)
is evidence:

* the window's finished requests missed the targets more often than allowed (by ``SIGMAS``
  binomial deviations: a window of a few hundred requests misses a point more or less by
  chance) while ``n >= r``
  and the pool was loaded (its queue, prefill backlog or inter-token time out of the reactive
  policy's low band): the model over-rates a worker, by at least ``(n + 1/2) / r`` (the real
  need is above ``n``). Misses on an unloaded pool are the requests' own (a 100k-token prompt
  misses a 2 s TTFT on any number of workers: the Mooncake trace misses 1% on every fleet),
  and more workers would not remove them;
* they met the targets while ``n < r``: the model under-rates a worker (the real need is at
  most ``n``): at most ``n / r``.

The factor ``k`` (the real need is ``k`` times the model's) moves half-way (in log space) to
the evidence that contradicts it, and back by ``RELAX`` of the way towards 1 after a window that
agrees with it; it stays within ``[LOW, HIGH]``. Multiplying the model's needs by it corrects
the next decisions: a removal to ``need * (1 + headroom)`` on a model that over-rates a worker
by a third, on a plateau, removed into misses; with the factor it holds the pool.

**Forecast error.** Each observation's forecast for ``horizon_s`` ahead is kept until then and
compared with the smoothed level the arrivals reached: the mean absolute error and the bias
(forecast over real) of the last ``KEEP`` are shown by ``interlock planner status``.

Pure: fed by the policy at each observation.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

LOW, HIGH = 0.5, 3.0
"""Bounds of the capacity factor."""

RELAX = 0.1
"""Share of the way (log space) the factor returns towards 1 after a window agreeing with it."""

MIN_FINISHED = 50
"""Fewest finished requests in a window for it to count as evidence."""

SIGMAS = 2.0
"""Misses count against the model only this many binomial deviations past the allowed share."""

KEEP = 50
"""Forecasts whose error is summarised."""


@dataclass(frozen=True, slots=True)
class Window:
    """One evaluated window (for status)."""

    at: float
    size: int
    need: float
    """The model's mean need over the window (before any correction)."""
    met: float
    verdict: str
    """"over-rates", "under-rates", "agrees" or "misses its own (unloaded)"."""


class CapacityError:
    def __init__(self, window_s: float, attainment: float) -> None:
        self.window_s = window_s
        self.attainment = attainment
        self.factor = 1.0
        self.last: Window | None = None
        self._start: float | None = None
        self._size: int | None = None
        self._stable_since = -math.inf
        self._needs: list[float] = []
        self._finished = 0
        self._met = 0
        self._loaded = False
        self._judged = 0

    def observe(
        self, now: float, size: int, starting: bool, need: float, finished: int, met: int, loaded: bool = True
    ) -> None:
        """One observation of a pool: its size (starting workers counted), whether a worker is
        starting, the model's need now, the requests that finished since the last one, and
        whether the pool is loaded (module docstring)."""
        self._loaded = self._loaded or loaded
        if size != self._size or starting:
            self._size = size
            self._stable_since = now
            self._reset(now)
            return
        if math.isfinite(need) and need > 0:
            self._needs.append(need)
        self._finished += finished
        self._met += met
        assert self._start is not None
        if now - self._start < self.window_s:
            return
        if (
            self._start - self._stable_since >= self.window_s
            and self._needs
            and self._finished >= MIN_FINISHED
        ):
            self._judged = self._finished
            self._judge(now, size, sum(self._needs) / len(self._needs), self._met / self._finished)
        self._reset(now)

    def _reset(self, now: float) -> None:
        self._start, self._needs, self._finished, self._met = now, [], 0, 0
        self._loaded = False

    def _judge(self, now: float, n: int, r: float, met: float) -> None:
        allowed = 1.0 - self.attainment
        # a window of a few hundred requests misses a point more or less by chance: evidence
        # against the model needs misses past the allowed share by SIGMAS binomial deviations
        missed = 1.0 - met > allowed + SIGMAS * math.sqrt(allowed * (1 - allowed) / max(self._judged, 1))
        if missed and n >= r and not self._loaded:
            verdict, evidence, move = "misses its own (unloaded)", 1.0, False
        elif missed and n >= r:
            verdict, evidence = "over-rates", (n + 0.5) / r
            move = evidence > self.factor
        elif met >= self.attainment and n < r:
            verdict, evidence = "under-rates", n / r
            move = evidence < self.factor
        else:
            verdict, evidence, move = "agrees", 1.0, False
        if move:
            self.factor = math.exp((math.log(self.factor) + math.log(evidence)) / 2)
        elif verdict == "agrees":
            self.factor = math.exp((1 - RELAX) * math.log(self.factor))
        self.factor = min(HIGH, max(LOW, self.factor))
        self.last = Window(now, n, r, met, verdict)


class ForecastError:
    def __init__(self) -> None:
        self._due: deque[tuple[float, float]] = deque()
        """(when, forecast rate) not yet compared."""
        self._errors: deque[float] = deque(maxlen=KEEP)
        """(forecast - real) / real of the last forecasts compared."""

    def observe(self, now: float, horizon_s: float, forecast: float, level: float) -> None:
        """Keep ``forecast`` (for ``now + horizon_s``); compare the ones due with ``level``."""
        while self._due and self._due[0][0] <= now:
            _, f = self._due.popleft()
            if level > 0:
                self._errors.append((f - level) / level)
        self._due.append((now + horizon_s, forecast))

    def summary(self) -> dict[str, float] | None:
        """Mean absolute error and bias of the last forecasts compared (None: none yet)."""
        if not self._errors:
            return None
        n = len(self._errors)
        return {
            "compared": n,
            "mean_abs_error": sum(abs(e) for e in self._errors) / n,
            "bias": sum(self._errors) / n,
        }
