"""A bounded schemathesis run against ``interlock serve --runner mock``: no response is a 5xx.

Schemathesis reads the server's own /openapi.json and sends what it generates from it, schema-
valid bodies and deliberately invalid ones, to every operation (coverage and fuzzing phases).
The run is deterministic (``--generation-deterministic``), so CI sends the same cases each time.
Besides schemathesis's checks, the server's own figures must show no 5xx and its log no
unexpected error.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_serve

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-fuzz"
EXAMPLES = 300  # per operation: about 25 s of fuzzing on two busy cores
# Nine in ten bodies name the served model, so they get past the 404 to the generation path.
CONFIG = f"""
[parameters]
"body.model" = {{ dictionary = "served", probability = 0.9 }}

[dictionaries.served]
values = ["{MODEL}"]
"""
# Every check but positive_data_acceptance: a body the document allows can still be refused for
# what depends on the served model (the prompt plus max_tokens over its context length, token ids
# past its vocabulary), and JSON Schema's "integer" admits 3.0, which the strict decoder refuses.
CHECKS = ("--checks", "all", "--exclude-checks", "positive_data_acceptance")
SERVE = (
    "--runner",
    "mock",
    "--workers",
    "1",
    "--max-model-len",
    "256",
    "--num-blocks",
    "128",
    "--speedup",
    "1000",
    "--api-key",
    KEY,
)


def test_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    served = start_serve(*SERVE, timeout_s=120)
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(config),
                "--no-color",
                "run",
                served.url + "/openapi.json",
                *CHECKS,
                "--max-examples",
                str(EXAMPLES),
                "--generation-deterministic",
                "--workers",
                "1",
                "--request-timeout",
                "30",
                "--header",
                f"Authorization: Bearer {KEY}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
        assert re.search(r"\d+ generated, \d+ passed", run.stdout), run.stdout[-3000:]
        metrics = httpx.get(served.url + "/metrics", timeout=10).text
        counted = re.findall(r'^interlock_http_requests_total\{[^}]*status="(\d+)"\} (\S+)', metrics, re.M)
        assert counted and not [s for s, n in counted if s.startswith("5") and float(n) > 0], counted
        assert "unexpected error" not in "".join(served.lines), "".join(served.lines)[-6000:]
    finally:
        served.stop()
