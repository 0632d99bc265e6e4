"""vLLM workers behind Interlock, end to end: the real SmolLM2, vLLM's CPU build in each worker
process, NATS, the openai client.

One cluster of two vLLM workers (fp32, eager: greedy output does not depend on the batch) serves
every test here, in order: greedy output equals vLLM's own OpenAI server on the same prompts and
settings; a repeated long prefix goes to the worker that holds it and vLLM reports the cached
tokens; a dead engine core under a live worker process takes that worker out (it exits and is
restarted) and no request fails; a worker SIGKILLed under 16 streams loses none of them and each
ends with the same text as an uninterrupted run, and its vLLM engine core does not outlive it;
a dead engine core's shared-memory segments do not outlive it either.
Skipped where vLLM is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from interlock import scratch, shm
from interlock.engine import vllm
from tests.e2e.conftest import FAST_LEASES, Served, free_port, start_serve, wait_until

if not vllm.installed():
    pytest.skip(f"vLLM is not installed ({vllm.INSTALL_HINT})", allow_module_level=True)

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ENGINE = ("--dtype", "float32", "--max-model-len", "2048", "--block-size", "32")
"""The same engine settings for vLLM's server and Interlock's vLLM workers."""
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three primary colors:",
    "Once upon a time, in a small village,",
]
PREFIX = " ".join(f"Rule {i}: every answer must be short and polite." for i in range(60))


def model_dir() -> str:
    from interlock.model_store import resolve_model

    return str(resolve_model("smollm2", progress=False))


class VllmServer:
    """vLLM's own OpenAI server (the reference), in its own session, killed whole at the end."""

    def __init__(self) -> None:
        self.port = free_port()
        self.rpc_dir = tempfile.mkdtemp(prefix="vllm-reference-")  # its socket files, removed at stop
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_RPC_BASE_PATH": self.rpc_dir,
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                model_dir(),
                "--served-model-name",
                MODEL,
                "--port",
                str(self.port),
                "--enforce-eager",
                "--kv-cache-memory-bytes",
                str(512 << 20),
                *ENGINE,
            ],  # fmt: skip
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        def up() -> bool:
            try:
                return bool(self.client().models.list().data)
            except openai.APIError:
                return False

        if (
            not wait_until(lambda: up() or self.proc.poll() is not None, timeout_s)
            or self.proc.poll() is not None
        ):
            self.stop()
            pytest.fail("vLLM's server did not start:\n" + "".join(self.lines[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.rpc_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def reference_server() -> Iterator[VllmServer]:
    """vLLM's own server, started while the cluster below starts (their imports, tens of seconds
    of CPU each, overlap) and stopped once its completions are in."""
    server = VllmServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def served(reference_server: VllmServer) -> Iterator[Served]:
    """Two vLLM workers under ``interlock serve``."""
    s = start_serve(
        "--engine", "vllm", "--workers", "2", "--kv-cache-gib", "0.5", "--engine-arg", "enforce_eager=true",
        *ENGINE, *FAST_LEASES, timeout_s=420,
    )  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(reference_server: VllmServer, served: Served) -> dict[str, str]:
    """vLLM's own greedy completions of ``PROMPTS`` (its server, then stopped)."""
    reference_server.wait_ready()
    try:
        return complete_all(reference_server.client(), PROMPTS)
    finally:
        reference_server.stop()


def complete(client: openai.OpenAI, prompt: str, max_tokens: int = 32) -> str:
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return r.choices[0].text


def complete_all(client: openai.OpenAI, prompts: list[str], max_tokens: int = 32) -> dict[str, str]:
    """``complete`` for each prompt, all at once (fp32 eager greedy output does not depend on the
    batch, and one at a time an eager CPU decode takes seconds a prompt)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = pool.map(lambda p: complete(client, p, max_tokens), prompts)
        return dict(zip(prompts, texts, strict=True))


def client_of(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=120)


def test_greedy_output_equals_vllms_own_server(reference: dict[str, str], served: Served) -> None:
    client = client_of(served)
    assert complete_all(client, PROMPTS) == reference
    # Chat goes through the frontend's chat template and detokenizer, vLLM's engine below.
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert "Paris" in (r.choices[0].message.content or "")


def test_disaggregated_over_vllms_connector_gives_the_aggregated_output(
    reference: dict[str, str], tmp_path: Path
) -> None:
    """One prefill and one decode vLLM worker, every request prefilled remotely (enforced):
    vLLM's NIXL connector moves the KV, and the output is the aggregated one."""
    cfg = tmp_path / "disagg.yaml"
    cfg.write_text(
        """
execution-group:
  engine: vllm
  engine_args: {enforce_eager: true}
  nodes:
    - {node_role: prefill, gpu_count: 1, kv_cache_gib: 0.5}
    - {node_role: decode, gpu_count: 1, kv_cache_gib: 0.5}
routing: {policy: kv, enforce_disagg: true}
"""
    )
    s = start_serve("-f", str(cfg), *ENGINE, *FAST_LEASES, timeout_s=420)
    try:
        client = client_of(s)
        assert complete_all(client, PROMPTS) == reference
        # A long prompt: most of its KV crosses over, and the decode side's own prefix hit on
        # a repeat is kept (it pulls only what it lacks).
        long = PREFIX + " And so"
        first, again = complete(client, long, 16), complete(client, long, 16)
        assert first == again
        metrics = httpx.get(s.url + "/metrics", timeout=10).text
        assert 'interlock_disagg_choices_total{reason="enforced"' in metrics, metrics
        assert "not_staged" not in metrics and "prefill_failed" not in metrics

        # The decode worker pulled every prompt over NIXL; none fell back to computing it.
        def handoffs() -> dict[str, float]:
            text = httpx.get(s.url + "/metrics", timeout=10).text
            found = re.findall(r'interlock_worker_kv_handoffs_total\{[^}]*outcome="(\w+)"\} (\S+)', text)
            total: dict[str, float] = {}
            for k, v in found:  # summed over the two workers
                total[k] = total.get(k, 0.0) + float(v)
            return total

        n = len(PROMPTS) + 2
        want = {"nixl_prefills": n, "nixl_pulls": n, "nixl_failed": 0}
        assert wait_until(
            lambda: {k: v for k, v in handoffs().items() if v or k == "nixl_failed"} == want, 15
        )
    finally:
        s.stop()


def routed(client: openai.OpenAI, prompt: str) -> tuple[str, int]:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, extra_headers={"x-interlock-explain": "1"}
    )
    worker = raw.headers["x-interlock-route"].split(";")[0].split("=")[-1]
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return worker, usage.prompt_tokens_details.cached_tokens or 0


def test_a_repeated_long_prefix_goes_to_the_worker_that_holds_it(served: Served) -> None:
    client = client_of(served)
    first, cached = routed(client, PREFIX + " Question 0: why?")
    assert cached == 0
    for i in range(1, 6):
        worker, cached = routed(client, PREFIX + f" Question {i}: why?")
        assert worker == first
        assert cached >= 32 * 20  # vLLM's own count of the prompt tokens it did not compute


def test_agent_fields_reach_vllm(served: Served) -> None:
    """JSON schemas and forced tool calls are enforced by vLLM's own structured outputs; tool
    calls are parsed by the frontend; a penalty reaches vLLM's sampler."""
    import json

    client = client_of(served)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe the weather in Rome."}],
        response_format=fmt,  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
    )
    data = json.loads(r.choices[0].message.content or "")
    assert set(data) == {"city", "sunny"} and isinstance(data["sunny"], bool)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
    assert set(json.loads(calls[0].function.arguments)) == {"city", "sunny"}
    plain = complete(client, "one two one two one two one two")
    penalised = (
        client.completions.create(
            model=MODEL,
            prompt="one two one two one two one two",
            max_tokens=32,
            temperature=0,
            frequency_penalty=2.0,
        )
        .choices[0]
        .text
    )
    assert penalised != plain


def worker_pids(served: Served) -> list[int]:
    return served.worker_pids()


def engine_core_of(worker_pid: int) -> int | None:
    """vLLM's engine core: the worker process's child started by multiprocessing's spawn
    (its other child is multiprocessing's resource tracker)."""
    for task in Path(f"/proc/{worker_pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"EngineCore" in cmd or b"spawn_main" in cmd:
                    return int(pid)
            except OSError:
                continue
    return None


def test_a_dead_engine_core_takes_its_worker_out_and_no_request_fails(served: Served) -> None:
    client = client_of(served)
    before = worker_pids(served)
    assert len(before) == 2
    victim = before[0]
    core = engine_core_of(victim)
    assert core is not None, "no vLLM engine core under the worker"
    segments = shm.mapped_by([core])
    assert segments, "vLLM's engine core maps no shared-memory segment"
    os.kill(core, signal.SIGKILL)
    # The worker process notices, leaves discovery and exits; serve restarts it.
    assert wait_until(lambda: not Path(f"/proc/{victim}").exists() or _zombie(victim), 30)
    assert all(complete_all(client, PROMPTS, max_tokens=8).values())
    assert wait_until(lambda: len(worker_pids(served)) == 2 and victim not in worker_pids(served), 60)
    assert wait_until(lambda: _ready_workers(served) == 2, 300), "".join(served.lines[-40:])
    # The dead core's message queues (RAM in /dev/shm) went with it.
    assert not [n for n in segments if (shm.SHM_DIR / n).exists()]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _ready_workers(served: Served) -> int:
    try:
        text = httpx.get(served.url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    return sum(1 for line in text.splitlines() if line.startswith("interlock_worker_kv_blocks_capacity{"))


def test_a_worker_killed_under_16_streams_loses_none(served: Served) -> None:
    client = client_of(served)
    prompts = [f"Story {i}: a fox and a crow" for i in range(16)]
    want = complete_all(client, prompts, max_tokens=48)
    got: dict[str, str] = {}
    progress: dict[str, int] = {}
    errors: list[BaseException] = []

    def stream(p: str) -> None:
        try:
            chunks = client.completions.create(
                model=MODEL, prompt=p, max_tokens=48, temperature=0, stream=True
            )
            text = ""
            for chunk in chunks:
                if chunk.choices:
                    text += chunk.choices[0].text
                    progress[p] = progress.get(p, 0) + 1
            got[p] = text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(progress) == 16 and min(progress.values()) >= 3, 120)
    victim = worker_pids(served)[0]
    core = engine_core_of(victim)
    segments = shm.mapped_by([core] if core else [])
    # vLLM's socket files are in the worker's scratch directory, not loose in /tmp
    scratch_dirs = list(
        Path(tempfile.gettempdir()).glob(f"{scratch.PREFIX}{scratch._namespace()}-{victim}-*")
    )
    assert len(scratch_dirs) == 1 and any(p.is_socket() for p in scratch_dirs[0].iterdir()), scratch_dirs
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    for t in threads:
        t.join(max(1.0, 180 - (time.monotonic() - started)))
    assert not errors, errors
    assert got == want
    # vLLM's engine core outlives a SIGKILLed worker by itself: serve kills it with the worker.
    assert core is not None and wait_until(lambda: _zombie(core), 30)
    # ... and its shared-memory segments with it.
    assert segments and wait_until(lambda: not [n for n in segments if (shm.SHM_DIR / n).exists()], 10)
    # ... and its socket files (serve's supervisor sweeps the scratch directory it left)
    assert wait_until(lambda: not scratch_dirs[0].exists(), 10)
