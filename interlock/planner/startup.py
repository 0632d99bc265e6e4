"""How long a new worker takes from "add" to "serving", per engine and model: measured, smoothed.

A worker that is asked for now serves only after its process starts, its engine loads the
weights (vLLM may compile) and it registers with the router: seconds for the mock runner, tens
for a model on a CPU, minutes for a compiling vLLM. The policies use the figure to add earlier
and remove later; the fleet measures it on every add it sees come up and keeps it here.

The estimate is an exponentially weighted mean (``alpha`` of each new measurement): start-up
time moves with the page cache and compile caches, so recent starts say more than old ones,
and one slow start (a cold cache) moves it only part of the way. A figure from the capability
profile (``CapabilityProfile.startup_s``) seeds a key until the first measurement, which then
replaces it: the profile timed the engine alone, a measurement the whole path to serving.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StartupKey:
    engine: str
    """What the worker runs: ``interlock/torch``, ``interlock/mock``, ``vllm``."""
    model: str


class StartupTimes:
    def __init__(self, alpha: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._seconds: dict[StartupKey, float] = {}
        self._measured: dict[StartupKey, int] = {}

    def seed(self, key: StartupKey, seconds: float) -> None:
        """A prior figure (the profile's), used until ``key``'s first measurement."""
        if seconds > 0 and not self._measured.get(key):
            self._seconds[key] = seconds

    def record(self, key: StartupKey, seconds: float) -> None:
        """One worker of ``key`` took ``seconds`` from add to serving."""
        if seconds < 0:
            raise ValueError("a start-up time is >= 0")
        n = self._measured.get(key, 0)
        old = self._seconds.get(key)
        self._seconds[key] = seconds if n == 0 or old is None else old + self.alpha * (seconds - old)
        self._measured[key] = n + 1

    def estimate(self, key: StartupKey) -> float:
        """Seconds from add to serving (0: neither measured nor seeded)."""
        return self._seconds.get(key, 0.0)


__all__ = ["StartupKey", "StartupTimes"]
