"""The SLA policy: size each pool so the forecast traffic meets the TTFT and ITL targets, from
the workers' measured capability (``planner.profile``), as Dynamo's SLA planner does with its
pre-deployment profile.

Each observation feeds the forecaster (``planner.forecast``). With a forecast of ``rate``
requests/s of mean prompt, uncached prompt and output lengths, a pool needs
``need = rate / per_worker_rate`` workers (aggregated: ``aggregated_rate``; disaggregated:
``prefill_rate`` for the prefill pool and ``decode_rate`` for the decode pool). Grow while the
pool has fewer than ``need`` workers; shrink only while one fewer would still hold
``need * (1 + headroom)`` (hysteresis: a need hovering near a whole number moves the pool one
way only).
"""

from __future__ import annotations

import math

from interlock.planner.config import PlannerConfig
from interlock.planner.forecast import ArrivalForecaster, Forecast
from interlock.planner.policy import Want
from interlock.planner.profile import CapabilityProfile, needed
from interlock.planner.state import Observation, WorkerView


class SlaPolicy:
    def __init__(self, config: PlannerConfig, profile: CapabilityProfile) -> None:
        self.config = config
        self.profile = profile
        self.forecaster = ArrivalForecaster()
        self.last_need: dict[str, float] = {}
        """Workers needed per pool at the last observation (for status)."""

    def needs(self, f: Forecast) -> dict[str, float]:
        c, p = self.config, self.profile
        ttft, itl = c.ttft_ms / 1000.0, c.itl_ms / 1000.0
        if c.prefill.max == 0 and c.decode.max == 0:
            per = p.aggregated_rate(f.prompt_tokens, f.uncached_tokens, f.output_tokens, ttft, itl,
                                    c.attainment)
            return {"both": needed(f.rate, per)}
        return {"prefill": needed(f.rate, p.prefill_rate(f.uncached_tokens, ttft, c.attainment)),
                "decode": needed(f.rate, p.decode_rate(f.prompt_tokens, f.output_tokens, itl))}

    def wants(self, obs: Observation, pools: dict[str, list[WorkerView]]) -> list[Want]:
        self.forecaster.observe(obs.traffic)
        f = self.forecaster.forecast(self.config.horizon_s)
        if f is None:
            return []
        self.last_need = self.needs(f)
        out: list[Want] = []
        for role, need in self.last_need.items():
            n = len(pools.get(role, ()))
            if n < need:
                shown = "inf" if math.isinf(need) else f"{need:.2f}"
                out.append(Want(role, +1, need / max(n, 1),
                                f"forecast {f.rate:.2f} req/s needs {shown} {role} workers, have {n}"))
            elif n >= 1 and need * (1 + self.config.headroom) <= n - 1:
                out.append(Want(role, -1, (n - 1) / max(need, 1e-9),
                                f"forecast {f.rate:.2f} req/s needs {need:.2f} {role} workers "
                                f"(+{self.config.headroom:.0%} headroom fits in {n - 1})"))
        return out
