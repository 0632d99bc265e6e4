"""Choosing each linear layer's kernel per row count by measurement (issue 11)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interlock.engine.model import cpu_ops
from interlock.engine.model.kernel_choice import (
    KernelTable,
    LinearPlan,
    cache_path,
    choose,
    load_or_measure,
    machine_key,
    monotone,
)
from interlock.engine.model.linear import Linear, candidates

BF16 = torch.bfloat16


def test_choose_takes_the_fastest_per_bucket_and_merges_ranges() -> None:
    times = {"small": {1: 1.0, 8: 2.0, 64: 9.0, 512: 80.0},
             "onednn": {1: 3.0, 8: 4.0, 64: 5.0, 512: 40.0}}
    plan = choose(times)
    assert plan == LinearPlan((8, 512), ("small", "onednn"))
    assert [plan.impl_for(r) for r in (1, 8, 9, 64, 512, 5000)] == ["small", "small", "onednn", "onednn",
                                                                      "onednn", "onednn"]


def test_a_winner_within_the_margin_does_not_displace_the_incumbent() -> None:
    times = {"small": {1: 1.0, 8: 2.0, 64: 10.0}, "onednn": {1: 2.0, 8: 1.95, 64: 9.0}}
    assert choose(times, margin=0.05) == LinearPlan((8, 64), ("small", "onednn"))
    assert choose(times, margin=0.0) == LinearPlan((1, 64), ("small", "onednn"))


def test_monotone_smooths_a_disturbed_small_bucket() -> None:
    assert monotone({1: 5.0, 2: 90.0, 4: 6.0, 8: 12.0}) == {1: 5.0, 2: 6.0, 4: 6.0, 8: 12.0}


def test_the_table_round_trips_and_decides_the_same(tmp_path: Path) -> None:
    plan = LinearPlan((4, 64, 2048), ("small", "onednn", "torch"))
    table = KernelTable("cpu X", {(64, 32): plan}, {"64x32": {"small": {1: 1e-5}}})
    again = KernelTable.from_json(table.to_json())
    assert again == table
    assert [again.plans[(64, 32)].impl_for(r) for r in range(1, 100)] == [plan.impl_for(r) for r in range(1, 100)]
    assert "rows 5-64" in again.describe() and "onednn" in again.describe()


def test_a_cached_table_is_used_without_measuring(tmp_path: Path) -> None:
    machine = machine_key(["test"])
    plan = LinearPlan((8, 4096), ("small", "torch"))
    path = cache_path(tmp_path, machine)
    path.parent.mkdir(parents=True)
    path.write_text(KernelTable(machine, {(32, 16): plan}, {}).to_json())

    def refuse(shape: tuple[int, int]) -> dict[str, object]:
        raise AssertionError("measured although cached")

    table = load_or_measure([(32, 16)], refuse, max_rows=64, cache_dir=tmp_path, machine=machine)  # type: ignore[arg-type]
    assert table.plans[(32, 16)] == plan
    # Another machine's table (a different key) is not reused: it measures.
    measured = load_or_measure([(32, 16)], candidates, max_rows=4, cache_dir=tmp_path, machine=machine + "!")
    assert (32, 16) in measured.plans
    assert cache_path(tmp_path, machine + "!").exists()


@pytest.mark.parametrize("impl", ["small", "onednn", "torch"])
@pytest.mark.parametrize("rows", [1, 3, 16, 100])
def test_each_kernel_computes_the_reference(impl: str, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(96, 64, generator=gen) * 0.1).to(BF16)
    bias = (torch.randn(96, generator=gen) * 0.1).to(BF16)
    x = torch.randn(rows, 64, generator=gen).to(BF16)
    lin = Linear(weight, bias, plan=LinearPlan.only(impl))
    if impl == "small" and cpu_ops.load() is None:
        assert lin.kernel_for(rows) != "small"  # falls back where the kernel cannot run
    reference = F.linear(x.float(), weight.float(), bias.float())
    assert (lin(x).float() - reference).abs().max() < 0.02 * float(reference.abs().max())


def test_a_mixed_plan_switches_kernel_by_rows() -> None:
    if cpu_ops.load() is None:
        pytest.skip("no fused CPU kernels on this machine")
    weight = (torch.randn(64, 32) * 0.1).to(BF16)
    lin = Linear(weight, plan=LinearPlan((4, 4096), ("small", "onednn")))
    assert [lin.kernel_for(r) for r in (1, 4, 5, 512)] == ["small", "small", "onednn", "onednn"]
    for rows in (2, 50, 3):
        x = torch.randn(rows, 32).to(BF16)
        assert torch.allclose(lin(x).float(), F.linear(x, weight).float(), atol=0.02, rtol=0.02)
