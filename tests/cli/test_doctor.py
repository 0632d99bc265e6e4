"""``interlock doctor kernels``: the kernel table of the default model on this machine."""

from __future__ import annotations

import pytest

from interlock.cli import doctor
from interlock.engine.model import cpu_ops


def test_doctor_kernels_prints_every_operation_of_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["kernels", "--summary"]) == 0
    out = capsys.readouterr().out
    if cpu_ops.load() is None and cpu_ops.load_f32() is None:
        assert "no choice to make here" in out
        return
    for op in (
        "linear 960x576",
        "linear 49152x576",
        "attention decode 9/3x64 ctx 256",
        "attention prefill 9/3x64",
        "add_rms_norm 576",
        "silu_mul 1536",
        "rope_write_kv 9/3x64",
    ):
        assert op + ":" in out
    assert "measured (us per call)" not in out  # --summary: the ranges only
