"""Placement counts a model's weights as the engine measured them when it last loaded here
(every layout its kernels keep), not as their files' size."""

from __future__ import annotations

from pathlib import Path

from interlock.cluster.spec import worker_needs
from interlock.cluster.worker import WorkerSpec
from interlock.deploy import ExecutionGroup
from interlock.engine.config import EngineConfig, ModelConfig
from interlock.model_store import footprint

MIB = 1 << 20


def test_a_measured_footprint_is_kept_per_model_and_dtype(cache_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    assert footprint.measured(model, "auto") is None
    footprint.record(model, "auto", 532 * MIB)
    footprint.record(tmp_path / "model" / ".." / "model", "float32", 621 * MIB)  # the same folder
    assert footprint.measured(model, "auto") == 532 * MIB
    assert footprint.measured(model, "float32") == 621 * MIB
    assert footprint.measured(tmp_path / "other", "auto") is None
    (cache_dir / footprint.FILE).write_text("not json")
    assert footprint.measured(model, "auto") is None  # unreadable: an estimate instead


def _needs(dtype: str, measured: int | None, tensor: int = 1) -> int:
    engine = EngineConfig(model=ModelConfig(dtype=dtype, num_threads=1, tensor_parallel_size=tensor))
    ws = WorkerSpec(engine=engine, served_name="m", model_path="/m", role="both", instance_id="x")
    group = ExecutionGroup(model="/m")
    return worker_needs(
        ws, group, weights_bytes=257 * MIB, kv_token_bytes=0, measured_weights=measured
    ).memory_bytes


def test_placement_counts_the_measured_weights_where_known() -> None:
    assert _needs("auto", 532 * MIB) - _needs("auto", None) == (532 - 257) * MIB
    assert _needs("float32", None) - _needs("auto", None) == 257 * MIB  # the files' size doubled
    # A group of ranks splits its weights: the one-process measurement does not apply.
    assert _needs("auto", 532 * MIB, tensor=2) == _needs("auto", None, tensor=2)
