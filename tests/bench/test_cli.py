"""``interlock bench`` end to end: a sweep and a trace replay against the fake server (in a
thread with its own event loop), then ``compare`` over their results files."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import matplotlib.image
import pytest

from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.results import load
from interlock.bench.stats import Targets
from interlock.cli.bench import main, parse_targets

from .test_trace import ROWS


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    server = FakeOpenAIServer(FakeTiming(ttft_s=0.02, itl_s=0.005, fail_every=((9, 503),)))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def _png_ok(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(str(path)).shape[0] > 300


def test_sweep_trace_and_compare(
    server_url: str, tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep.json"
    common = ["--url", server_url, "--no-progress", "--warmup", "0"]
    rc = main(
        [
            *common,
            "--concurrency",
            "1,3",
            "--num-requests",
            "9",
            "--input-len",
            "uniform:20:40",
            "--output-len",
            "6",
            "--goodput",
            "ttft=500,itl=100",
            "--out",
            str(sweep),
        ]
    )
    assert rc == 0
    results = load(sweep)
    assert [r.label for r in results.runs] == ["c=1", "c=3"]
    assert results.meta["model"] == "fake-model" and results.targets == Targets(ttft_ms=500, itl_ms=100)
    errors = [r.error for run in results.runs for r in run.records]
    assert errors.count("http_503") == 2 and len(errors) == 18  # every 9th arrival fails
    doc = json.loads(sweep.read_text())
    assert doc["runs"][1]["summary"]["errors"] == {"http_503": 1}
    _png_ok(sweep.with_suffix(".png"))

    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in ROWS))
    replay = tmp_path / "replay.json"
    rc = main(
        [
            *common,
            "--api",
            "completions",
            "--tokenizer",
            str(tokenizer_dir),
            "--prompt-as",
            "ids",
            "--trace",
            str(trace),
            "--speedup",
            "10",
            "--out",
            str(replay),
            "--no-plot",
        ]
    )
    assert rc == 0
    assert [r.input_tokens for r in load(replay).runs[0].records] == [row["input_length"] for row in ROWS]

    png = tmp_path / "cmp.png"
    assert main(["compare", str(sweep), str(replay), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "sweep:c=1" in out and "replay:trace x10" in out and "TTFT p99 (ms)" in out
    _png_ok(png)


def test_the_report_puts_the_servers_own_figures_beside_the_clients(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one.json"
    argv = ["--url", server_url, "--no-progress", "--warmup", "0", "--concurrency", "2"]
    assert main([*argv, "--num-requests", "4", "--output-len", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "server prefill time (mean)  20.0 ms" in text  # the fake's injected TTFT
    assert "server queue time (mean)    not available" in text  # the fake does not export it
    (finished,) = [line for line in text.splitlines() if line.startswith("server requests by finish")]
    assert "length=" in finished  # "error=" too where the fake's every 9th arrival fell in this run
    (run,) = load(out).runs
    assert run.server is not None and run.server.prefill_time_mean_s == pytest.approx(0.02)
    _png_ok(out.with_suffix(".png"))


def test_a_server_without_metrics_is_benched_all_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = asyncio.new_event_loop()
    server = FakeOpenAIServer(FakeTiming(ttft_s=0.01, itl_s=0.002), metrics=False)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        url = asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)
        out = tmp_path / "none.json"
        argv = ["--url", url, "--no-progress", "--warmup", "0", "--concurrency", "1", "--num-requests", "2"]
        assert main([*argv, "--output-len", "2", "--out", str(out), "--no-plot"]) == 0
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
    assert "server /metrics  not available" in capsys.readouterr().out
    assert load(out).runs[0].server is None


def test_bad_options_exit_2(server_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", server_url, "--rate", "1", "--prompt-as", "ids"]) == 2
    assert "--prompt-as ids" in capsys.readouterr().err


def test_parse_targets() -> None:
    assert parse_targets(["ttft=200", "tpot:40,e2e=9000"]) == Targets(200, 40, 9000)


def test_unreachable_endpoint_fails_fast(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1", "--no-progress"]
    assert main(argv) == 2
    assert "connect_error" in capsys.readouterr().err
