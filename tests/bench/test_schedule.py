import pytest

from interlock.bench.schedule import arrival_offsets
from interlock.errors import ConfigError


def test_constant_arrivals() -> None:
    assert arrival_offsets(4.0, 5, "constant") == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_poisson_arrivals_have_the_rate_and_a_seed() -> None:
    offsets = arrival_offsets(10.0, 5001, "poisson", seed=3)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 9.5 < 5000 / offsets[-1] < 10.5
    assert offsets == arrival_offsets(10.0, 5001, "poisson", seed=3)
    assert offsets != arrival_offsets(10.0, 5001, "poisson", seed=4)


def test_rate_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        arrival_offsets(0.0, 3)
