"""comm: the shared-memory all-reduce (ranks as threads here; the group test runs processes)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from interlock.engine.parallel.comm import GroupLost, ShmReduce, create_shm, load_sync

pytestmark = pytest.mark.skipif(load_sync() is None, reason="no C compiler: gloo all-reduces instead")


def _reduce_in_threads(
    ranks: int, elements: int, inputs: list[list[torch.Tensor]]
) -> list[list[torch.Tensor]]:
    fd = create_shm(ranks, elements)
    try:
        reducers = [ShmReduce(fd, ranks, r, elements, timeout_s=30) for r in range(ranks)]
    finally:
        os.close(fd)
    out: list[list[torch.Tensor]] = [[] for _ in range(ranks)]

    def run(r: int) -> None:
        for t in inputs[r]:
            out[r].append(reducers[r](t))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in reducers:
        r.close()
    return out


def test_every_rank_gets_the_same_sum_call_after_call_and_in_pieces() -> None:
    g = torch.Generator().manual_seed(7)
    ranks, calls = 3, 9
    # 7 x 5 = 35 elements through slots of 16: three pieces per call.
    inputs = [
        [torch.randn(7, 5, generator=g, dtype=torch.float32) for _ in range(calls)] for _ in range(ranks)
    ]
    out = _reduce_in_threads(ranks, 16, inputs)
    for c in range(calls):
        want = inputs[0][c] + inputs[1][c] + inputs[2][c]
        assert torch.allclose(out[0][c], want, atol=1e-6)
        assert torch.equal(out[0][c], out[1][c]) and torch.equal(out[0][c], out[2][c])


def test_bf16_partials_are_added_in_fp32_and_keep_their_dtype() -> None:
    inputs = [[torch.full((2, 4), 1.0 + 2**-8, dtype=torch.bfloat16)] for _ in range(2)]
    (a,), (b,) = _reduce_in_threads(2, 64, inputs)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert torch.equal(a, (inputs[0][0].float() * 2).to(torch.bfloat16))


def test_a_rank_that_never_comes_is_reported_not_waited_for() -> None:
    fd = create_shm(2, 8)
    try:
        alone = ShmReduce(fd, 2, 0, 8, timeout_s=0.2)
    finally:
        os.close(fd)
    with pytest.raises(GroupLost, match="tensor rank 1 of this stage did not answer"):
        alone(torch.ones(4))
    alone.close()
