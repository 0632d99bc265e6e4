"""Length distributions for synthetic prompts and outputs, parsed from one short spec string.

Specs: ``512`` (fixed), ``uniform:LO:HI`` (inclusive integers), ``normal:MEAN:STD`` (rounded,
clipped to at least 1). Sampling takes an explicit ``random.Random`` so a seed reproduces a run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from interlock.errors import ConfigError

Kind = Literal["fixed", "uniform", "normal"]


@dataclass(frozen=True)
class LengthDist:
    kind: Kind
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> LengthDist:
        parts = spec.strip().split(":")
        try:
            if len(parts) == 1:
                dist = cls("fixed", float(int(parts[0])))
            elif len(parts) == 3 and parts[0] in ("uniform", "normal"):
                dist = cls(parts[0], float(parts[1]), float(parts[2]))  # type: ignore[arg-type]
            else:
                raise ValueError(spec)
        except ValueError as exc:
            raise ConfigError(f"bad length spec {spec!r}: use N, uniform:LO:HI or normal:MEAN:STD") from exc
        dist.validate()
        return dist

    def validate(self) -> None:
        if self.kind == "fixed" and self.a < 1:
            raise ConfigError("a fixed length must be at least 1")
        if self.kind == "uniform" and not (1 <= self.a <= self.b):
            raise ConfigError("uniform:LO:HI needs 1 <= LO <= HI")
        if self.kind == "normal" and (self.a < 1 or self.b < 0):
            raise ConfigError("normal:MEAN:STD needs MEAN >= 1 and STD >= 0")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(1, round(rng.gauss(self.a, self.b)))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        return f"{self.kind}:{self.a:g}:{self.b:g}"
