from __future__ import annotations

from pathlib import Path

import pytest

from interlock.cli.main import main
from interlock.engine.timing import TimingModel
from interlock.planner import load_profile


def test_mock_profile_matches_the_timing_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    rc = main(
        [
            "profile",
            "--runner",
            "mock",
            "-o",
            str(out),
            "--num-blocks",
            "2000",
            "--lengths",
            "64,512,1024,2048",
            "--batches",
            "1,8,32",
            "--contexts",
            "256,1024",
            "--decode-steps",
            "3",
            "--repeats",
            "1",
        ]
    )
    assert rc == 0
    assert "wrote" in capsys.readouterr().err
    p = load_profile(out)
    t = TimingModel()
    assert [x.tokens for x in p.prefill] == [64, 512, 1024, 2048]
    assert p.prefill[1].seconds == pytest.approx(t.step_s(512, 0, 0.0))
    assert len(p.decode) == 6 and p.kv_tokens == 2000 * 64
    d = p.decode[-1]
    assert (d.batch, d.context) == (32, 1024)
    assert d.itl_s == pytest.approx(t.step_s(0, 32, 32 * 1030 / p.kv_tokens), rel=0.02)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--lengths", "a,b"], "--lengths: expected comma-separated integers"),
        (["--batches", "0"], "--batches: every value must be at least 1"),
        (["--threads", "2"], "--threads and --dtype apply to the torch runner only"),
        (["--decode-steps", "0"], "--decode-steps and --repeats must be at least 1"),
    ],
)
def test_bad_flags_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    rc = main(["profile", "--runner", "mock", "-o", str(tmp_path / "p.json"), "--num-blocks", "200", *args])
    assert rc == 2 and words in capsys.readouterr().err
