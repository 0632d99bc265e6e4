"""The SLA policy: size each pool so the forecast traffic meets the TTFT and ITL targets, from
the workers' measured capability (``planner.profile``), as Dynamo's SLA planner does with its
pre-deployment profile.

Each observation feeds the forecaster (``planner.forecast``). With a forecast of ``rate``
requests/s of mean prompt, uncached prompt and output lengths, a pool needs
``need = rate / per_worker_rate`` workers (aggregated: ``aggregated_rate``; disaggregated:
``prefill_rate`` for the prefill pool and ``decode_rate`` for the decode pool). Grow while the
pool has fewer than ``need`` workers (asking for the shortfall); shrink only while one fewer
would still hold ``need * (1 + headroom)`` (asking for as many as would; hysteresis: a need
hovering near a whole number moves the pool one way only). The core moves at most
``step_share`` of the pool per step.

Requests seen one by one (``Traffic.arrivals``: the replay, and live the finished requests with
their arrival times): once ``MIN_SAMPLE`` of the last ``SAMPLE_S`` are known, the TTFT side is
sized by ``planner.queueing`` (the pool as one G/G/c queue over the sample's prefill times and
inter-arrival gaps: heavy-tailed prompts and bursts need more workers at a trough, and a busy
pool fewer per request than ``n`` separate M/M/1 queues), the ITL side by ``aggregated_rate``
with the sample's mean prefill time, the larger need deciding; mean lengths then come from the
sample too (minutes of requests, not the forecaster's half minute). On the Mooncake day the
means' model's need was 0.29-0.83 of the offline bound's sizes (phase means, from the trough to
the peak: the headroom had to cover a bias that moved by 3x); this one's is 0.54-0.84.

A removal must also fit the need at the forecast rate plus ``NOISE_Z`` deviations of the rate's
own noise (``upper``): a smoothed count of a few bursty requests a second swings by a fifth
between observations, and a removal at a low swing came back as an add at the next high one.

Observed feedback (``slo_feedback``): the share of finished requests that missed a target is
smoothed over about the last ``FEEDBACK_REQUESTS`` requests (starting from the allowed share, so
a few early misses move it little: a 1% rate cannot be read from a handful); when it exceeds
the allowed ``1 - attainment``, every need is multiplied by ``sqrt(observed / allowed)``,
between 1 and 2. The model sees mean lengths and mean inter-token times; the feedback covers
what it cannot see (heavy prompt tails, a short answer sharing a step with a long prefill chunk).

A surge (arrivals jump far above what the pool was sized for): when the arrivals of the last
``SURGE_S`` alone (no smoothing, no trend) come at least ``surge`` (a key) times as fast as the
forecaster's smoothed level, and the pool (starting workers included) is two or more workers
short of what that rate needs (with the observed-SLO correction, as the ordinary path sizes),
the policy asks for the whole shortfall at once; the core adds it in one decision within the
bounds and the change cap. One worker per window after a step leaves the fleet short for
minutes while the smoothed level catches up (it lags a step by ``TAU_S``). The test is on
arrivals against their own recent level, not on the need against the pool, so neither a pool
that the feedback has sized up (a x6 step then looks like x1.4 of the pool) nor the feedback
alone decides it; a diurnal rise never comes near it (10 s arrivals at most 1.4x the level on
the Mooncake day at one and two times the users), a x6 step passes it for the half minute the
level takes to follow. The correction in the size is the one from before the jump (the misses
the surge causes finish later).

Work already queued is the reactive policy's business: a pool also grows when the reactive
policy says so (a forecast of arrivals does not see a backlog left by a surge). A pool the
forecast says is too large shrinks when either the reactive policy agrees (a whole window with
its queues, backlog and inter-token time low) or the requests that finished over the last
``window_s`` met the targets at least ``attainment`` of the time (at least
``MIN_WINDOW_REQUESTS`` of them) while arrivals are not rising and the reactive policy does not
ask to grow (on a rise the window's success says nothing about the next one): waiting for
every reactive signal to settle kept the peak's fleet for minutes after the peak, with the
observed SLO saying there was room.

A removal that the pool had to turn back from (it grew again within ``TURN_WINDOWS`` windows,
the load per worker not having risen) is not repeated for half an hour (``planner.turns``): when
the model's need is short of the real one by more than the headroom, the headroom rule removes
into misses, the feedback grows the pool back, the correction fades and the same removal came
again every two windows on a steady load; at a trough the misses that turn it back take minutes
to count (a few requests a second), so the memory looks five windows back.

The policy checks itself (``planner.calibration``). The capacity model's error is measured
window by window against what happened (a pool at or above the model's need that missed the
targets: the model over-rates a worker) and its factor multiplies the model's needs, with the
observed-SLO correction when that is larger; the forecasts' errors against the arrivals that
came are kept. Both are in ``status()`` (``interlock planner status``). And a removal is
refused while the requests finished over the last window met the targets less often than
``attainment`` (or, with too few of them, while the smoothed miss share is above the allowed
one): the model's "fits in fewer" is not taken on trust while requests miss.

Start-up (``Observation.startup_s``, measured by the fleet): the forecast looks at least that
far ahead, so a pool grows in time for the workers it adds to serve the load that comes, and
keeps the workers the load will need again before a new one could start.

Tail-aware sizing (``tail``, aggregated pools, when the connector reports requests one by one):
means cannot see bursts and heavy-tailed prompts, which at a trough make two workers lose one
request in twelve. The policy then replays the requests of the last ``TAIL_SAMPLE_S`` against
candidate pool sizes (``planner.tail``), denser by the forecast's rate over theirs, and needs
the smallest size whose predicted miss share is within ``1 - attainment`` of the share that
even the largest allowed pool misses (a 100k-token prompt misses a 2 s TTFT on any number of
workers; no worker added helps it). It shrinks when one worker fewer would still be within
that at ``1 + headroom`` times the forecast. The observed-SLO feedback then compares the misses
seen with that same allowance, so misses the model already explains do not size the pools up
twice.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from interlock.planner.calibration import CapacityError, ForecastError
from interlock.planner.config import PlannerConfig
from interlock.planner.forecast import SHIFT_S, TAU_S, ArrivalForecaster, Forecast
from interlock.planner.policy import Want
from interlock.planner.profile import CapabilityProfile, needed
from interlock.planner.queueing import PrefillSample, workers_for_ttft
from interlock.planner.reactive import ReactivePolicy
from interlock.planner.state import Observation, Traffic, WorkerView
from interlock.planner.tail import Job, StepTimes, miss_share, workers_needed
from interlock.planner.turns import TurnMemory

FEEDBACK_REQUESTS = 500
"""Memory of the observed-miss estimate, in finished requests."""

MIN_WINDOW_REQUESTS = 100
"""Fewest finished requests in a window whose attainment may justify a removal on its own."""

TAIL_SAMPLE_S = 120.0
"""The tail model replays the requests of the last this many seconds."""

MIN_TAIL_JOBS = 50
"""Fewer requests than this in the sample: size from means."""

SAMPLE = 2000
"""The queueing model (``planner.queueing``) reads at most this many recent requests..."""

SAMPLE_S = 600.0
"""...that arrived within this many seconds..."""

MIN_SAMPLE = 200
"""...and at least this many (else the means' model): a spread read from a few dozen
heavy-tailed prompts swings by half."""

TURN_WINDOWS = 5
"""An add this many windows after a removal, the load per worker not having risen, refutes it."""

NOISE_Z = 1.0
"""A removal must fit the need at the forecast rate plus this many deviations of its noise."""

SURGE_S = SHIFT_S
"""A surge is read from the arrivals of the last this many seconds (the forecaster's recent rate)."""


@dataclass(frozen=True, slots=True)
class TailSizing:
    """The tail model's answer for one pool (kept for the reasons and for status)."""

    need: int
    """Smallest pool size within the allowance at the forecast."""
    fits_fewer: bool
    """One worker fewer would be within it at ``1 + headroom`` times the forecast."""
    share: float
    """Predicted miss share at the current size."""
    floor: float
    """Predicted miss share at the largest allowed size (no size does better)."""


@dataclass(frozen=True, slots=True)
class _Sizing:
    """What one observation sized, read by each pool's decision."""

    f: Forecast
    raw: dict[str, float]
    """The model's needs at the forecast, before the correction."""
    surge: dict[str, float]
    """The needs at the recent arrival rate (corrected)."""
    upper: dict[str, float]
    """The needs at the rate's noise (``upper``)."""
    recent: float
    level: float
    met: float | None
    """The window's attainment (``window_attainment``)."""


class SlaPolicy:
    def __init__(self, config: PlannerConfig, profile: CapabilityProfile) -> None:
        self.config = config
        self.profile = profile
        self.forecaster = ArrivalForecaster()
        self.last_need: dict[str, float] = {}
        """Workers needed per pool at the last observation (for status)."""
        self.missed = 1.0 - config.attainment
        """Smoothed share of finished requests that missed a target."""
        self.correction = 1.0
        self.reactive = ReactivePolicy(config)
        self.turns = TurnMemory(TURN_WINDOWS * config.window_s)
        """Removals the pool had to turn back from (``planner.turns``)."""
        self._done: deque[tuple[float, int, int]] = deque()
        """(time, finished, met) over the last window."""
        self._jobs: deque[Job] = deque()
        """Requests seen one by one, for the tail model."""
        self._first_seen: float | None = None
        self._floor = 0.0
        """The tail model's last predicted floor (misses no pool size avoids)."""
        self._new = 0
        self._predicted: float | None = None
        """The tail model's smoothed miss share for the recent requests at the size they met."""
        self.last_tail: TailSizing | None = None
        self._times: deque[tuple[float, float, int, int]] = deque(maxlen=SAMPLE)
        """(arrival, prefill seconds, prompt tokens, output tokens) of the recent requests seen
        one by one."""
        self._built: PrefillSample | None = None
        self._means: tuple[float, float] | None = None
        """The sample and its mean prompt and output lengths, built from ``_times`` at most
        once per observation."""
        self.capacity: dict[str, CapacityError] = {}
        """role -> the capacity model's measured error (``planner.calibration``)."""
        self.forecast_error = ForecastError()
        self._startup_s = 0.0
        """The fleet's measured start-up (``Observation.startup_s``)."""
        self._last_forecast: Forecast | None = None
        self._last_met: float | None = None

    def window_attainment(self, now: float) -> float | None:
        """Share of the requests finished over the last ``window_s`` that met the targets
        (None: fewer than ``MIN_WINDOW_REQUESTS`` finished)."""
        while self._done and self._done[0][0] <= now - self.config.window_s:
            self._done.popleft()
        finished = sum(d[1] for d in self._done)
        return sum(d[2] for d in self._done) / finished if finished >= MIN_WINDOW_REQUESTS else None

    def needs(self, f: Forecast) -> dict[str, float]:
        c, p = self.config, self.profile
        f = self.lengths(f)
        ttft, itl = c.ttft_ms / 1000.0, c.itl_ms / 1000.0
        sample = self.prefill_sample()
        allowed = 1.0 - c.attainment
        if c.prefill.max == 0 and c.decode.max == 0:
            per = p.aggregated_rate(
                f.prompt_tokens,
                f.uncached_tokens,
                f.output_tokens,
                ttft,
                itl,
                c.attainment,
                prefill_s=sample.mean if sample is not None else None,
            )
            if sample is None:
                return {"both": needed(f.rate, per)}
            return {"both": max(needed(f.rate, per), workers_for_ttft(sample, f.rate, ttft, allowed))}
        prefill = (
            workers_for_ttft(sample, f.rate, ttft, allowed)
            if sample is not None
            else needed(f.rate, p.prefill_rate(f.uncached_tokens, ttft, c.attainment))
        )
        return {
            "prefill": prefill,
            "decode": needed(f.rate, p.decode_rate(f.prompt_tokens, f.output_tokens, itl)),
        }

    def upper(self, f: Forecast) -> dict[str, float]:
        """The need at the forecast rate plus ``NOISE_Z`` standard deviations of its noise (a
        count smoothed over ``TAU_S``, as bursty as the sample's arrivals): what a removal must
        fit. A few requests a second in bursts swing the smoothed rate by a fifth either way, and
        a removal at a low swing came back as an add at the next high one; at tens of requests a
        second the band is a few percent and the descent keeps its pace."""
        sample = self.prefill_sample()
        ca2 = sample.ca2 if sample is not None else 1.0
        sd = math.sqrt(f.rate * max(ca2, 1.0) / (2 * TAU_S))
        return self._corrected(self.needs(replace(f, rate=f.rate + NOISE_Z * sd)))

    def prefill_sample(self) -> PrefillSample | None:
        """The recent requests seen one by one (``planner.queueing``); None: too few, size
        from means. Built once per observation (the needs, the surge's and the noise band's
        read it several times)."""
        if len(self._times) < MIN_SAMPLE:
            return None
        if self._built is None:
            seen = sorted(self._times)
            self._built = PrefillSample.of([x[0] for x in seen], [x[1] for x in seen])
        return self._built

    def lengths(self, f: Forecast) -> Forecast:
        """``f`` with the sample's mean prompt and output lengths (over its minutes, not the
        forecaster's half minute: a few dozen heavy-tailed prompts swing their mean by half)."""
        if len(self._times) < MIN_SAMPLE:
            return f
        if self._means is None:
            n = len(self._times)
            self._means = (sum(x[2] for x in self._times) / n, sum(x[3] for x in self._times) / n)
        return replace(f, prompt_tokens=self._means[0], output_tokens=self._means[1])

    def _sample(self, t: Traffic, now: float) -> None:
        for a in t.arrivals:
            uncached = max(a.prompt_tokens - a.cached_tokens, 1)
            self._times.append((a.at, self.profile.prefill_s(uncached), a.prompt_tokens, a.output_tokens))
        while self._times and self._times[0][0] < now - SAMPLE_S:
            self._times.popleft()
        self._built, self._means = None, None

    def _feedback(self, finished: int, met: int) -> None:
        if not self.config.slo_feedback or finished <= 0:
            return
        miss = 1.0 - met / finished
        a = 1.0 - (1.0 - 1.0 / FEEDBACK_REQUESTS) ** finished
        self.missed += a * (miss - self.missed)
        allowed = 1.0 - self.config.attainment
        self.correction = min(2.0, max(1.0, math.sqrt(self.missed / allowed)))

    def calibration(self) -> float:
        """Tail model: observed misses over the ones it predicts at the sizes the requests met
        (0.5..2; 1 without feedback or before both are known)."""
        if not self.config.slo_feedback or not self._predicted:
            return 1.0
        return min(2.0, max(0.5, self.missed / self._predicted))

    def _remember(self, t: Traffic, now: float) -> list[Job]:
        """Add the requests seen one by one; the sample of the last ``TAIL_SAMPLE_S``, sorted."""
        p = self.profile
        self._new = len(t.arrivals)
        for a in t.arrivals:
            uncached = max(a.prompt_tokens - a.cached_tokens, 1)
            chunks = -(-uncached // p.chunk_tokens)
            self._jobs.append(Job(a.at, p.prefill_s(uncached), chunks, a.output_tokens))
        if t.arrivals and self._first_seen is None:
            self._first_seen = now - t.duration_s
        while self._jobs and self._jobs[0].at < now - TAIL_SAMPLE_S:
            self._jobs.popleft()
        return sorted((j for j in self._jobs if j.at >= now - TAIL_SAMPLE_S), key=lambda j: j.at)

    def _tail(self, jobs: list[Job], f: Forecast, n: int, now: float) -> TailSizing:
        c, p = self.config, self.profile
        ttft, itl = c.ttft_ms / 1000.0, c.itl_ms / 1000.0
        span = min(TAIL_SAMPLE_S, now - (self._first_seen if self._first_seen is not None else now))
        scale = f.rate / (len(jobs) / max(span, 1.0))
        ctx = f.prompt_tokens + f.output_tokens / 2
        batch = 1.0
        for _ in range(5):  # Little's law at the current size
            batch = min(p.max_batch, f.rate / max(n, 1) * f.output_tokens * p.itl_s(batch, ctx))
        steps = StepTimes(p.itl_s(max(batch, 1.0), ctx), p.prefill_s(p.chunk_tokens))
        most = c.total_max()

        def share(size: int, x: float) -> float:
            return miss_share(jobs, size, steps, ttft, itl, x)

        now_share = share(n, 1.0) if n else 1.0
        w = 1.0 - (1.0 - 1.0 / FEEDBACK_REQUESTS) ** self._new
        self._predicted = (
            now_share if self._predicted is None else self._predicted + w * (now_share - self._predicted)
        )
        allowed = (1.0 - c.attainment) / self.calibration()
        self._floor = share(most, scale)
        need = workers_needed(jobs, steps, ttft, itl, self._floor + allowed, scale=scale, most=most)
        wider = scale * (1.0 + c.headroom)
        fits = n > 1 and share(n - 1, wider) <= share(most, wider) + allowed
        return TailSizing(need, fits, share(n, scale) if n else 1.0, self._floor)

    @property
    def horizon_s(self) -> float:
        """How far ahead arrivals are forecast: ``horizon_s``, or the start-up of a worker
        (the profile's, or the fleet's measured one) when longer: an add decided now serves
        only then."""
        return max(self.config.horizon_s, self.profile.startup_s, self._startup_s)

    def factor(self, role: str) -> float:
        """What the model's need is multiplied by: the measured capacity error, or the
        observed-SLO correction when that is larger."""
        cap = self.capacity.get(role)
        k = cap.factor if cap is not None and self.config.slo_feedback else 1.0
        return max(k, self.correction) if self.correction > 1.0 else k

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        self._startup_s = obs.startup_s
        jobs, met = self._record(obs)
        self._last_met = met
        backlog = {w.role: w for w in self.reactive.wants(obs, pools) if w.delta != 0}
        f = self.forecaster.forecast(self.horizon_s)
        self._last_forecast = f
        if f is None:
            return [w for w in backlog.values() if w.delta > 0]
        self.forecast_error.observe(obs.now, self.horizon_s, f.rate, self.forecaster.level or 0.0)
        sizing = self._size(f, jobs, met, pools, obs.now)
        t = obs.traffic
        for role, ws in pools.items():
            cap = self.capacity.setdefault(role, CapacityError(self.config.window_s, self.config.attainment))
            starting = any(not w.ready for w in ws)
            cap.observe(
                obs.now, len(ws), starting, sizing.raw.get(role, 0.0), t.finished, t.met, self._loaded(role)
            )
        out: list[Want] = []
        for role, need in self.last_need.items():
            want = self._want(role, need, len(pools.get(role, ())), backlog.get(role), sizing)
            if want is not None:
                out.append(want)
        return out

    def _record(self, obs: Observation) -> tuple[list[Job], float | None]:
        """Feed one observation to the forecaster, the feedback, the window and the samples;
        the tail model's jobs and the window's attainment."""
        t = obs.traffic
        self.forecaster.observe(t)
        self._feedback(t.finished, t.met)
        if t.finished:
            self._done.append((obs.now, t.finished, t.met))
        jobs = self._remember(t, obs.now)
        self._sample(t, obs.now)
        return jobs, self.window_attainment(obs.now)

    def _size(
        self, f: Forecast, jobs: list[Job], met: float | None, pools: dict[str, list[WorkerView]], now: float
    ) -> _Sizing:
        """The needs at the forecast (``last_need``; the tail model's for an aggregated pool),
        at the recent arrival rate (a surge's) and at the rate's noise (a removal's)."""
        raw = self.needs(f)
        self.last_need = self._corrected(raw)
        self.turns.observe(now, {r: len(ws) for r, ws in pools.items()}, raw)
        recent = self.forecaster.recent
        level = self.forecaster.level or 0.0
        surge = self._corrected(self.needs(replace(f, rate=recent)))
        upper = self.upper(f)
        self.last_tail = None
        if self.config.tail and "both" in self.last_need and len(jobs) >= MIN_TAIL_JOBS:
            self.last_tail = self._tail(jobs, f, len(pools.get("both", ())), now)
            self.last_need["both"] = float(self.last_tail.need)
        return _Sizing(f, raw, surge, upper, recent, level, met)

    def _corrected(self, needs: dict[str, float]) -> dict[str, float]:
        """``needs`` times each pool's ``factor``."""
        return {r: n * self.factor(r) for r, n in needs.items()}

    def _want(self, role: str, need: float, n: int, queued: Want | None, s: _Sizing) -> Want | None:
        """What one pool of ``n`` workers needing ``need`` asks for: a surge, the reactive
        policy's grow, a grow to the need, a removal, or nothing."""
        tail = self.last_tail if role == "both" else None
        high = max(s.upper.get(role, need), need)
        more = surge_size(s.recent, s.level, s.surge[role], n, self.config.surge)
        if more > 1:
            return self._surge_want(role, more, n, s)
        if queued is not None and queued.delta > 0 and n >= need:
            return queued
        if n < need:
            shown = "inf" if math.isinf(need) else f"{need:.2f}"
            return Want(
                role,
                max(1, math.ceil(need) - n) if math.isfinite(need) else 1,
                need / max(n, 1),
                f"forecast {s.f.rate:.2f} req/s needs {shown} {role} workers, have {n}" + self._why(tail, n),
            )
        fits_fewer = tail.fits_fewer if tail else high * (1 + self.config.headroom) <= n - 1
        if n >= 1 and fits_fewer:
            return self._shrink_want(role, need, high, n, queued, s, tail)
        return None

    def _surge_want(self, role: str, more: int, n: int, s: _Sizing) -> Want:
        return Want(
            role,
            more,
            s.surge[role] / max(n, 1),
            f"arrivals {s.recent:.2f} req/s over the last {SURGE_S:g}s (level {s.level:.2f}) "
            f"need {s.surge[role]:.2f} {role} workers, have {n}: a surge" + self._why_corrected(),
            surge=True,
        )

    def _shrink_want(
        self,
        role: str,
        need: float,
        high: float,
        n: int,
        queued: Want | None,
        s: _Sizing,
        tail: TailSizing | None,
    ) -> Want | None:
        """A removal, when the reactive policy agrees or the window met the targets on arrivals
        that are not rising; never under the size a removal was turned back from."""
        agrees = queued is not None and queued.delta < 0
        meeting = (
            s.met is not None
            and s.met >= self.config.attainment
            and queued is None
            and not self.forecaster.rising()
        )
        refused = self._refusal(s)
        if refused:
            return Want(role, 0, 0.0, f"removal refused: {refused}")
        if not (agrees or meeting):
            return None
        why = ""
        if not agrees and s.met is not None:
            why = f", {100 * s.met:.1f}% met the targets over {self.config.window_s:g}s"
        spare = 1 if tail else n - math.ceil(high * (1 + self.config.headroom))
        why = f" (+{self.config.headroom:.0%} headroom fits in {n - spare}){why}"
        fewest = self.turns.fewest(role, s.raw[role])
        if n - spare < fewest:
            spare = n - fewest
            why += (
                f", not under {fewest}: a removal to x{self.turns.floor(role):.2f} "
                f"the model's need was turned back from"
            )
            if spare < 1:
                return None
        held = f" ({high:.2f} at the rate's noise)" if high > need else ""
        return Want(
            role,
            -spare,
            (n - 1) / max(high, 1e-9),
            f"forecast {s.f.rate:.2f} req/s needs {need:.2f} {role} workers{held}{why}" + self._why(tail, n),
        )

    def _loaded(self, role: str) -> bool:
        """The pool's queue, backlog or inter-token time is out of the reactive low band now."""
        m = self.reactive.last_means.get(role)
        c = self.config
        if m is None:
            return False
        slow = m.itl is not None and m.itl > c.itl_low * c.itl_ms / 1000.0
        return m.queue > c.queue_low or m.backlog > c.backlog_low_s or slow

    def _refusal(self, s: _Sizing) -> str:
        """Why the observed attainment forbids a removal now ("" when it allows one)."""
        c = self.config
        if s.met is not None and s.met < c.attainment:
            return (
                f"{100 * s.met:.1f}% of the requests finished over {c.window_s:g}s met the "
                f"targets < {100 * c.attainment:g}%"
            )
        if s.met is None and c.slo_feedback and self.missed > 1.0 - c.attainment:
            return f"{100 * self.missed:.1f}% of the recent requests missed the targets > {100 * (1 - c.attainment):g}%"
        return ""

    def status(self) -> dict[str, object]:
        """The forecast and its errors, the model's needs and their correction, for
        ``interlock planner status``."""
        f = self._last_forecast
        out: dict[str, object] = {"horizon_s": self.horizon_s}
        if f is not None:
            out["forecast"] = {
                "rate": round(f.rate, 3),
                "prompt_tokens": round(f.prompt_tokens),
                "uncached_tokens": round(f.uncached_tokens),
                "output_tokens": round(f.output_tokens),
            }
        err = self.forecast_error.summary()
        if err is not None:
            out["forecast_error"] = {k: round(v, 3) for k, v in err.items()}
        out["needs"] = {r: round(n, 2) for r, n in self.last_need.items()}
        out["observed_miss_share"] = round(self.missed, 4)
        out["slo_correction"] = round(self.correction, 3)
        if self._last_met is not None:
            out["window_attainment"] = round(self._last_met, 4)
        out["capacity_error"] = {
            r: {
                "factor": round(c.factor, 3),
                **(
                    {
                        "last_window": {
                            "size": c.last.size,
                            "need": round(c.last.need, 2),
                            "met": round(c.last.met, 4),
                            "verdict": c.last.verdict,
                        }
                    }
                    if c.last is not None
                    else {}
                ),
            }
            for r, c in self.capacity.items()
        }
        return out

    def _why(self, tail: TailSizing | None, n: int) -> str:
        return self._why_tail(n) if tail else self._why_corrected()

    def _why_tail(self, n: int) -> str:
        t = self.last_tail
        if t is None:
            return ""
        return (
            f" (recent requests replayed: {100 * t.share:.1f}% would miss on {n}, "
            f"{100 * t.floor:.1f}% on {self.config.total_max()}; observed x{self.calibration():.2f} of predicted)"
        )

    def _why_corrected(self, role: str = "both") -> str:
        cap = self.capacity.get(role)
        k = cap.factor if cap is not None else 1.0
        out = ""
        if k != 1.0:
            out += f" (x{k:.2f}: the capacity model's measured error)"
        if self.correction > 1.0:
            out += f" (x{self.correction:.2f}: {100 * self.missed:.1f}% observed missing the targets)"
        return out


def surge_size(recent: float, level: float, need: float, n: int, factor: float = 1.5) -> int:
    """Workers to ask for at once (module docstring): the shortfall ``ceil(need) - n`` when the
    ``recent`` arrival rate is at least ``factor`` (``PlannerConfig.surge``; 0: never) times
    the smoothed ``level`` and the pool (of ``n``) is at least two short of ``need`` (the need
    at the recent rate); else one (the ordinary path)."""
    if not factor or not math.isfinite(need) or recent < factor * level or level <= 0:
        return 1
    more = math.ceil(need) - n
    return more if more >= 2 else 1
