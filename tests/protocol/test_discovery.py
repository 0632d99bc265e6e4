"""What a sane registration looks like: the checks routers apply before believing one."""

from __future__ import annotations

import pytest

from interlock.protocol import InstanceInfo, subjects
from interlock.protocol.discovery import MAX_CONTEXT_LENGTH, instance_problem

GOOD = InstanceInfo(
    instance_id="w1-abc",
    endpoint=subjects.GENERATE_ENDPOINT,
    model="smollm2",
    address="tcp://127.0.0.1:40123/interlock.worker.generate.w1-abc",
    block_size=16,
    kv_blocks_total=1024,
    context_length=2048,
)


def _with(**fields: object) -> InstanceInfo:
    import msgspec

    return msgspec.structs.replace(GOOD, **fields)


def test_a_real_worker_passes() -> None:
    assert instance_problem(GOOD) is None
    assert instance_problem(_with(address="tcp://[::1]:1/k", context_length=MAX_CONTEXT_LENGTH)) is None
    assert instance_problem(_with(address="nats-rp://abc/interlock.worker.generate.w1")) is None
    assert instance_problem(_with(address="inproc://interlock.worker.generate.w1", role="prefill")) is None


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"context_length": 10**9}, "context_length"),
        ({"context_length": 0}, "context_length"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 1 << 20}, "block_size"),
        ({"kv_blocks_total": -1}, "kv_blocks_total"),
        ({"instance_id": "a.b"}, "instance_id"),
        ({"instance_id": "x" * 65}, "instance_id"),
        ({"model": ""}, "model"),
        ({"model": "m\n"}, "model"),
        ({"role": "boss"}, "role"),
        ({"address": ""}, "address"),
        ({"address": "http://evil/"}, "address"),
        ({"address": "tcp://host:99999/k"}, "TCP address"),
        ({"address": "tcp://host/k"}, "TCP address"),
        ({"address": "tcp://h o:1/k"}, "TCP address"),
    ],
)
def test_insane_registrations_are_named(fields: dict[str, object], why: str) -> None:
    problem = instance_problem(_with(**fields))
    assert problem is not None and why in problem
