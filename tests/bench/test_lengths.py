import random

import pytest

from interlock.bench.lengths import LengthDist
from interlock.errors import ConfigError


def test_parse_and_sample() -> None:
    rng = random.Random(0)
    assert LengthDist.parse("128").sample(rng) == 128
    uniform = [LengthDist.parse("uniform:10:20").sample(rng) for _ in range(200)]
    assert min(uniform) >= 10 and max(uniform) <= 20 and len(set(uniform)) == 11
    normal = [LengthDist.parse("normal:100:10").sample(rng) for _ in range(2000)]
    assert 97 < sum(normal) / len(normal) < 103
    assert min(LengthDist.parse("normal:2:50").sample(rng) for _ in range(100)) >= 1


@pytest.mark.parametrize("spec", ["0", "abc", "uniform:5", "uniform:9:3", "gamma:1:2", "normal:0:1"])
def test_bad_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError):
        LengthDist.parse(spec)
