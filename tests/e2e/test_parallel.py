"""End to end: workers of several ranks (tensor and pipeline parallelism) behind
``interlock serve`` and the openai client: the same greedy text as one process (fp32), and a
rank SIGKILLed under load loses no stream (its worker ends, the streams migrate)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import FAST_LEASES, Served, start_serve, wait_until

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about trains.",
    "List three prime numbers.",
    "Why is the sky blue?",
]
COMMON = ("--dtype", "float32", "--max-model-len", "1024", *FAST_LEASES)
TOKENS = 40

pytestmark = pytest.mark.slow


def _client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=180)


def _greedy(client: openai.OpenAI, prompt: str) -> str:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def one_process() -> dict[str, str]:
    served = start_serve("--workers", "1", *COMMON)
    try:
        client = _client(served)
        return {p: _greedy(client, p) for p in PROMPTS}
    finally:
        served.stop()


@pytest.fixture(scope="module")
def tensor_pair() -> Iterator[Served]:
    served = start_serve("--workers", "2", "--tensor-parallel-size", "2", *COMMON)
    yield served
    served.stop()


def _ranks(worker: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{worker}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if b"interlock.engine.parallel.rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


def test_tensor_parallel_workers_answer_as_one_process(
    one_process: dict[str, str], tensor_pair: Served
) -> None:
    client = _client(tensor_pair)
    assert {p: _greedy(client, p) for p in PROMPTS} == one_process
    workers = tensor_pair.worker_pids()
    assert len(workers) == 2 and all(len(_ranks(w)) == 1 for w in workers)


def test_a_pipeline_worker_answers_as_one_process(one_process: dict[str, str]) -> None:
    served = start_serve("--workers", "1", "--pipeline-parallel-size", "2", *COMMON)
    try:
        client = _client(served)
        assert {p: _greedy(client, p) for p in PROMPTS[:2]} == {p: one_process[p] for p in PROMPTS[:2]}
    finally:
        served.stop()


def test_a_killed_rank_loses_no_stream(one_process: dict[str, str], tensor_pair: Served) -> None:
    client = _client(tensor_pair)
    texts: dict[int, str] = {}
    errors: list[BaseException] = []
    started = threading.Semaphore(0)

    def stream(k: int, prompt: str) -> None:
        try:
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=TOKENS,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            parts = []
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    if not parts:
                        started.release()
                    parts.append(chunk.choices[0].delta.content)
            texts[k] = "".join(parts)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
            started.release()

    jobs = [(k, PROMPTS[k % len(PROMPTS)]) for k in range(8)]
    threads = [threading.Thread(target=stream, args=job) for job in jobs]
    for t in threads:
        t.start()
    for _ in range(4):  # half the streams have their first token: they are in flight
        assert started.acquire(timeout=120)
    workers = tensor_pair.worker_pids()
    victim = next(r for w in workers for r in _ranks(w))
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(300)
    assert errors == []
    assert {k: texts[k] for k, _ in jobs} == {k: one_process[p] for k, p in jobs}
    # The worker whose rank died ended; serve starts it again, ranks and all.
    assert wait_until(lambda: len(tensor_pair.worker_pids()) == 2, 120)
    assert wait_until(lambda: all(len(_ranks(w)) == 1 for w in tensor_pair.worker_pids()), 120)
    assert _greedy(client, PROMPTS[0]) == one_process[PROMPTS[0]]
