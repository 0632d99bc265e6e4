"""Choosing each operation's kernel per size by measurement (issue 11): the table, its cache,
the pure choice, and the linear layer's kernels against the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from interlock.engine.model import cpu_ops
from interlock.engine.model.kernel_choice import (
    KernelTable,
    Op,
    Plan,
    cache_path,
    choose,
    load_or_measure,
    machine_key,
    monotone,
)
from interlock.engine.model.linear import Linear, linear_calls

BF16 = torch.bfloat16


def test_choose_takes_the_fastest_per_bucket_and_merges_ranges() -> None:
    times = {"small": {1: 1.0, 8: 2.0, 64: 9.0, 512: 80.0}, "onednn": {1: 3.0, 8: 4.0, 64: 5.0, 512: 40.0}}
    plan = choose(times)
    assert plan == Plan((8, 512), ("small", "onednn"))
    assert [plan.impl_for(r) for r in (1, 8, 9, 64, 512, 5000)] == [
        "small",
        "small",
        "onednn",
        "onednn",
        "onednn",
        "onednn",
    ]


def test_a_winner_within_the_margin_does_not_displace_the_incumbent() -> None:
    times = {"small": {1: 1.0, 8: 2.0, 64: 10.0}, "onednn": {1: 2.0, 8: 1.95, 64: 9.0}}
    assert choose(times, margin=0.05) == Plan((8, 64), ("small", "onednn"))
    assert choose(times, margin=0.0) == Plan((1, 64), ("small", "onednn"))


def test_monotone_smooths_a_disturbed_small_bucket() -> None:
    assert monotone({1: 5.0, 2: 90.0, 4: 6.0, 8: 12.0}) == {1: 5.0, 2: 6.0, 4: 6.0, 8: 12.0}


def test_ties_go_to_the_first_candidate_listed() -> None:
    assert choose({"fused": {1: 2.0}, "torch": {1: 2.0}}) == Plan((1,), ("fused",))
    assert choose({"torch": {1: 2.0}, "fused": {1: 2.0}}) == Plan((1,), ("torch",))


def test_the_table_round_trips_and_decides_the_same(tmp_path: Path) -> None:
    plan = Plan((4, 64, 2048), ("small", "onednn", "torch"))
    chunk = Plan((256, 2048), ("fused", "torch"))
    table = KernelTable(
        "cpu X",
        {"linear 64x32": plan, "attention prefill 9/3x64": chunk},
        {"linear 64x32": {"small": {1: 1e-5}}},
        provisional=True,
    )
    again = KernelTable.from_json(table.to_json())
    assert again == table
    assert [again.plans["linear 64x32"].impl_for(r) for r in range(1, 100)] == [
        plan.impl_for(r) for r in range(1, 100)
    ]
    text = again.describe()
    assert "rows 5-64" in text and "onednn" in text and "chunk 257+" in text and "provisional" in text


def _op(key: str, calls: object) -> Op:
    return Op(key, (1, 4), calls)  # type: ignore[arg-type]


def test_a_cached_table_is_used_without_measuring(tmp_path: Path) -> None:
    machine = machine_key(["test"])
    plan = Plan((8, 4096), ("small", "torch"))
    path = cache_path(tmp_path, machine)
    path.parent.mkdir(parents=True)
    path.write_text(KernelTable(machine, {"linear 32x16": plan}, {}).to_json())

    def refuse(size: int) -> dict[str, object]:
        raise AssertionError("measured although cached")

    lines: list[str] = []
    table = load_or_measure(
        [_op("linear 32x16", refuse)], cache_dir=tmp_path, machine=machine, progress=lines.append
    )
    assert table.plans["linear 32x16"] == plan and not lines
    # Another machine's table (a different key) is not reused: it measures, with progress lines.
    measured = load_or_measure(
        [Op("linear 32x16", (1, 4), linear_calls((32, 16)))],
        cache_dir=tmp_path,
        machine=machine + "!",
        progress=lines.append,
    )
    assert "linear 32x16" in measured.plans and cache_path(tmp_path, machine + "!").exists()
    assert any("[1/1] linear 32x16" in line for line in lines)


def test_only_the_missing_operations_are_measured_and_added(tmp_path: Path) -> None:
    machine = machine_key(["test"])
    slow, fast = (lambda: sum(range(2000))), (lambda: None)
    first = load_or_measure(
        [_op("a", lambda size: {"x": slow, "y": fast})], cache_dir=tmp_path, machine=machine
    )
    assert first.plans["a"].impls == ("y",)

    def refuse(size: int) -> dict[str, object]:
        raise AssertionError("measured again")

    both = load_or_measure(
        [_op("a", refuse), _op("b", lambda size: {"x": fast, "y": slow})], cache_dir=tmp_path, machine=machine
    )
    assert both.plans["a"] == first.plans["a"] and both.plans["b"].impls == ("x",)
    # The same table, read again, decides the same: nothing measured.
    again = load_or_measure([_op("a", refuse), _op("b", refuse)], cache_dir=tmp_path, machine=machine)
    assert again.plans == both.plans


def test_a_table_of_the_previous_format_is_neither_read_nor_overwritten(tmp_path: Path) -> None:
    machine = machine_key(["test"])
    assert cache_path(tmp_path, machine).name.endswith("-v2.json")
    assert KernelTable.from_json(KernelTable(machine, {}, {}).to_json()).machine == machine
    with pytest.raises(ValueError, match="format"):
        KernelTable.from_json('{"format": 1, "machine": "m", "plans": {}}')


@pytest.mark.parametrize("impl", ["small", "onednn", "torch"])
@pytest.mark.parametrize("rows", [1, 3, 16, 100])
def test_each_kernel_computes_the_reference(impl: str, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(96, 64, generator=gen) * 0.1).to(BF16)
    bias = (torch.randn(96, generator=gen) * 0.1).to(BF16)
    x = torch.randn(rows, 64, generator=gen).to(BF16)
    lin = Linear(weight, bias, plan=Plan.only(impl))
    if impl == "small" and cpu_ops.load() is None:
        assert lin.kernel_for(rows) != "small"  # falls back where the kernel cannot run
    reference = F.linear(x.float(), weight.float(), bias.float())
    assert (lin(x).float() - reference).abs().max() < 0.02 * float(reference.abs().max())


@pytest.mark.parametrize("rows", [1, 8, 300])
def test_fp32_weights_run_packed_for_onednn_and_agree_with_f_linear(rows: int) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this build of torch")
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen) * 0.1
    bias = torch.randn(96, generator=gen) * 0.1
    lin = Linear(weight, bias, fused=False)  # what the model's layers get without a table
    assert lin.kernel_for(rows) == "onednn" and lin.weight is None  # the plain copy is not kept
    x = torch.randn(rows, 64, generator=gen)
    assert torch.allclose(lin(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-5)


def test_a_mixed_plan_switches_kernel_by_rows() -> None:
    if cpu_ops.load() is None:
        pytest.skip("no fused CPU kernels on this machine")
    weight = (torch.randn(64, 32) * 0.1).to(BF16)
    lin = Linear(weight, plan=Plan((4, 4096), ("small", "onednn")))
    assert [lin.kernel_for(r) for r in (1, 4, 5, 512)] == ["small", "small", "onednn", "onednn"]
    for rows in (2, 50, 3):
        x = torch.randn(rows, 32).to(BF16)
        assert torch.allclose(lin(x).float(), F.linear(x, weight).float(), atol=0.02, rtol=0.02)


def test_a_provisional_table_is_not_measured_again_within_the_hour(tmp_path: Path) -> None:
    import time

    machine = machine_key(["test"])
    path = cache_path(tmp_path, machine)
    path.parent.mkdir(parents=True)
    busy = KernelTable(machine, {"a": Plan.only("x")}, {}, provisional=True, measured_at=time.time() - 60)
    path.write_text(busy.to_json())

    def refuse(size: int) -> dict[str, object]:
        raise AssertionError("measured again")

    assert load_or_measure([_op("a", refuse)], cache_dir=tmp_path, machine=machine) == busy


def test_measuring_stops_at_the_budget_and_a_later_start_goes_on(tmp_path: Path) -> None:
    machine = machine_key(["test"])
    ops = [_op(k, lambda size: {"x": lambda: None}) for k in ("a", "b")]
    lines: list[str] = []
    first = load_or_measure(ops, cache_dir=tmp_path, machine=machine, budget_s=0.0, progress=lines.append)
    assert list(first.plans) == ["a"] and any("measuring stopped" in line for line in lines)
    assert list(load_or_measure(ops, cache_dir=tmp_path, machine=machine).plans) == ["a", "b"]


def test_starts_at_the_same_time_measure_once(tmp_path: Path) -> None:
    """serve's workers start together: one measures, the others read its table."""
    import threading

    machine = machine_key(["test"])
    sizes: list[int] = []

    def calls(size: int) -> dict[str, object]:
        sizes.append(size)
        return {"x": lambda: None}

    tables: list[KernelTable] = []
    threads = [
        threading.Thread(
            target=lambda: tables.append(
                load_or_measure([_op("a", calls)], cache_dir=tmp_path, machine=machine)
            )
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sizes == [1, 4] and len(tables) == 3 and len({t.plans["a"] for t in tables}) == 1


def test_a_win_at_one_size_only_is_taken_for_noise() -> None:
    times = {"small": {1: 1.0, 8: 2.0, 64: 3.0, 512: 4.0}, "onednn": {1: 2.0, 8: 1.0, 64: 4.0, 512: 5.0}}
    assert choose(times) == Plan((512,), ("small",))
    # At the largest size there is no next one: a win there counts.
    times["onednn"][512] = 2.0
    assert choose(times) == Plan((64, 512), ("small", "onednn"))
