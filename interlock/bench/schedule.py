"""Send times for fixed-rate load (pure): constant gaps of ``1/rate`` or Poisson arrivals
(exponential gaps with mean ``1/rate``, seeded). The first request goes at time 0."""

from __future__ import annotations

import random
from typing import Literal

from interlock.errors import ConfigError

Arrival = Literal["poisson", "constant"]


def arrival_offsets(rate: float, n: int, arrival: Arrival = "poisson", seed: int = 0) -> list[float]:
    if rate <= 0:
        raise ConfigError("request rate must be positive")
    if arrival == "constant":
        return [i / rate for i in range(n)]
    if arrival != "poisson":
        raise ConfigError(f"unknown arrival process {arrival!r}")
    rng = random.Random(f"arrivals:{seed}")
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets
