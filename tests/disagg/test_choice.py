"""The per-request remote/local prefill choice (``router.disagg.choose``): plain calls."""

from __future__ import annotations

import math

import pytest

from interlock.errors import ConfigError
from interlock.router.disagg import (
    DisaggConfig,
    LinkEstimate,
    WorkerEstimate,
    choose,
    prefill_time_s,
)

CFG = DisaggConfig(default_prefill_tokens_per_s=1000.0, chunk_tokens=512)
FAST_LINK = LinkEstimate(bandwidth_bytes_per_s=1e9, rtt_s=1e-3)


def pick(
    *,
    prompt: int = 1000,
    kv: int = 1 << 20,
    blocks: int = 63,
    decode: WorkerEstimate | None = None,
    prefill: WorkerEstimate | None = None,
    link: LinkEstimate | None = FAST_LINK,
    config: DisaggConfig = CFG,
):  # type: ignore[no-untyped-def]
    decode = decode or WorkerEstimate("d", prefill_tokens_per_s=1000.0, free_blocks=1000)
    return choose(
        prompt_tokens=prompt,
        kv_bytes=kv,
        blocks_needed=blocks,
        decode=decode,
        prefill=prefill,
        link=link,
        config=config,
    )


def test_prefill_time_counts_queue_cache_and_the_running_batch() -> None:
    idle = WorkerEstimate("w", prefill_tokens_per_s=1000.0)
    assert prefill_time_s(idle, 1000, CFG) == pytest.approx(1.0)
    queued = WorkerEstimate("w", queued_prefill_tokens=500, prefill_tokens_per_s=1000.0, cached_tokens=500)
    assert prefill_time_s(queued, 1000, CFG) == pytest.approx(1.0)
    decoding = WorkerEstimate("w", prefill_tokens_per_s=1000.0, num_running=8, decode_step_s=0.05)
    assert prefill_time_s(decoding, 1000, CFG) == pytest.approx(1.0 + 2 * 0.05)  # two chunks of 512
    unknown = WorkerEstimate("w")  # no report yet: the configured default speed
    assert prefill_time_s(unknown, 500, CFG) == pytest.approx(0.5)


def test_idle_equal_workers_stay_local_the_transfer_only_adds() -> None:
    c = pick(prefill=WorkerEstimate("p", prefill_tokens_per_s=1000.0))
    assert not c.remote and c.reason == "local_faster"
    assert c.remote_ttft_s == pytest.approx(c.local_ttft_s + 1e-3 + (1 << 20) / 1e9)


def test_busy_decode_worker_sends_the_prefill_away() -> None:
    busy = WorkerEstimate(
        "d",
        queued_prefill_tokens=3000,
        prefill_tokens_per_s=1000.0,
        free_blocks=1000,
        num_running=16,
        decode_step_s=0.03,
    )
    c = pick(decode=busy, prefill=WorkerEstimate("p", prefill_tokens_per_s=1000.0))
    assert c.remote and c.reason == "remote_faster"
    assert c.local_ttft_s == pytest.approx(4.0 + math.ceil(4000 / 512) * 0.03)


def test_prefix_hit_on_the_prefill_worker_tips_the_balance() -> None:
    hit = WorkerEstimate("p", prefill_tokens_per_s=1000.0, cached_tokens=900)
    assert pick(prefill=hit).reason == "remote_faster"


def test_slow_link_keeps_it_local() -> None:
    busy = WorkerEstimate("d", queued_prefill_tokens=200, prefill_tokens_per_s=1000.0, free_blocks=1000)
    p = WorkerEstimate("p", prefill_tokens_per_s=1000.0)
    assert pick(decode=busy, prefill=p).remote
    slow = LinkEstimate(bandwidth_bytes_per_s=1e6, rtt_s=1e-3)  # 1 MiB takes a second
    assert pick(decode=busy, prefill=p, link=slow).reason == "local_faster"


def test_default_link_before_the_first_check() -> None:
    busy = WorkerEstimate("d", queued_prefill_tokens=5000, free_blocks=1000)
    c = pick(decode=busy, prefill=WorkerEstimate("p"), link=None)
    assert c.remote
    assert c.remote_ttft_s == pytest.approx(
        1.0 + CFG.default_rtt_s + (1 << 20) / CFG.default_bandwidth_bytes_per_s
    )


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"prefill": None}, "no_prefill_worker"),
        ({"kv": (1 << 30) + 1}, "kv_too_large"),
        ({"blocks": 1001}, "no_free_blocks"),
        ({"link": LinkEstimate(1e9, 1e-3, ok=False)}, "link_failed"),
    ],
)
def test_hard_reasons_stay_local_even_when_enforced(kw: dict, reason: str) -> None:
    args = {"prefill": WorkerEstimate("p", prefill_tokens_per_s=1e6), **kw}
    for config in (CFG, DisaggConfig(enforce=True)):
        c = pick(config=config, **args)
        assert not c.remote and c.reason == reason


def test_enforce_goes_remote_even_when_slower() -> None:
    c = pick(prefill=WorkerEstimate("p", prefill_tokens_per_s=10.0), config=DisaggConfig(enforce=True))
    assert c.remote and c.reason == "enforced" and c.remote_ttft_s > c.local_ttft_s


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        DisaggConfig(chunk_tokens=0)
    with pytest.raises(ConfigError):
        DisaggConfig(default_bandwidth_bytes_per_s=0)
