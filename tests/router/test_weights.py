"""Per-worker routing weights (the planner's cold-start ramp) and cache ownership counts."""

from __future__ import annotations

import pytest

from interlock.errors import ConfigError
from tests.router.test_model_router import PROMPT, cache, info, make, route


@pytest.mark.parametrize("policy", ["kv", "least-loaded", "power-of-two"])
def test_a_low_weight_worker_gets_a_smaller_share(policy: str) -> None:
    r, _ = make(2, policy=policy)
    r.set_weight("w1", 0.2)
    got = [route(r, f"r{i}", [i * 1000 + j for j in range(400)]).worker_id for i in range(30)]
    assert got.count("w0") > 2 * got.count("w1")
    r2, _ = make(2, policy=policy)
    even = [route(r2, f"r{i}", [i * 1000 + j for j in range(400)]).worker_id for i in range(30)]
    assert abs(even.count("w0") - even.count("w1")) <= 2


def test_weight_resets_when_a_worker_rejoins_and_is_validated() -> None:
    r, _ = make(2)
    r.set_weight("w1", 0.1)
    r.remove_worker("w1")
    r.add_worker(info("w1"))
    assert r._weights(2) is None  # back to 1: no weighting at all
    with pytest.raises(ConfigError, match="routing weight"):
        r.set_weight("w0", 0.0)
    r.set_weight("gone", 0.5)  # unknown worker: nothing to weigh


def test_unique_counts() -> None:
    r, _ = make(3)
    cache(r, "w0", PROMPT)
    cache(r, "w1", PROMPT[:200])
    n = len(PROMPT) // 4
    assert r.indexer.unique_counts() == {"w0": n - 50, "w1": 0, "w2": 0}
