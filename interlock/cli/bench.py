"""``interlock bench``: load-test an OpenAI-compatible endpoint; ``interlock bench compare`` runs;
``interlock bench fake-server`` starts the fake server with injected delays.

Load modes (exactly one): ``--concurrency N`` (closed loop), ``--rate R`` (open loop, Poisson or
constant arrivals) or ``--trace FILE`` (Mooncake trace replay). A comma list (``--rate 1,2,4``)
is a sweep: one run per value, in order, all in one results file and one report.

Around each run the server's own ``/metrics`` is read (``?scope=fleet`` where it is an Interlock
frontend), and what it counted meanwhile (queue and prefill time, cache hit rate, migrations,
preemptions, requests by finish reason) is reported beside the client's figures; a server without
metrics is benched all the same ("not available").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from interlock.bench.client import Endpoint
from interlock.bench.lengths import LengthDist
from interlock.bench.loadgen import Bounds, LoadPlan, RunResult, run_load, warm_up
from interlock.bench.plans import concurrency_plan, rate_plan, trace_plan
from interlock.bench.plots import PlotRun, report_png
from interlock.bench.prompts import SyntheticSpec
from interlock.bench.results import BenchFile, load, save
from interlock.bench.server_metrics import figures, scrape
from interlock.bench.stats import Targets, summarize
from interlock.bench.table import compare_table, server_table, summary_table
from interlock.bench.vocab import Vocab, load_vocab
from interlock.cli import flags
from interlock.errors import ConfigError
from interlock.mooncake import TRACE_BLOCK_SIZE, load_mooncake


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") from exc


def parse_targets(items: list[str] | None) -> Targets:
    """``ttft=200 itl=50 e2e=2000`` (ms; ``:`` works as well as ``=``; commas as well as spaces)."""
    values: dict[str, float] = {}
    for item in [p for chunk in items or [] for p in chunk.split(",") if p]:
        key, sep, value = item.replace(":", "=").partition("=")
        if not sep or key not in ("ttft", "itl", "e2e", "tpot"):
            raise ConfigError(f"bad goodput target {item!r}: use ttft=MS, itl=MS, e2e=MS")
        values[f"{'itl' if key == 'tpot' else key}_ms"] = float(value)
    return Targets(**values)


def run_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock bench", __doc__.splitlines()[0])
    _add_endpoint_args(p)
    _add_load_args(p)
    _add_prompt_args(p)
    _add_run_args(p)
    p.add_argument("--out", help="results JSON (default bench-YYYYmmdd-HHMMSS.json)")
    p.add_argument("--png", help="report PNG (default: the results path with .png)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return flags.apply_environment(p)


def _add_endpoint_args(p: argparse.ArgumentParser) -> None:
    """What is measured: the server, its model and API, and how prompts are sent."""
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--tokenizer", help="local Hugging Face tokenizer folder: token-exact prompts")
    p.add_argument(
        "--prompt-as",
        choices=("text", "ids"),
        default="text",
        help="ids: send token ids as the completions prompt (needs --tokenizer)",
    )


def _add_load_args(p: argparse.ArgumentParser) -> None:
    """The load mode (exactly one) and how arrivals come."""
    load_mode = p.add_mutually_exclusive_group(required=True)
    load_mode.add_argument("--concurrency", type=_floats, help="fixed concurrency (comma list: sweep)")
    load_mode.add_argument("--rate", type=_floats, help="requests per second (comma list: sweep)")
    load_mode.add_argument("--trace", help="Mooncake trace (JSONL) to replay")
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--max-concurrency", type=int, help="cap on requests in flight (rate and trace modes)")
    p.add_argument(
        "--speedup",
        type=_floats,
        default=[1.0],
        help="trace arrival speed-up: divide inter-arrival times by this (2 = twice as "
        "fast, as in interlock replay; comma list: sweep)",
    )
    p.add_argument("--block-size", type=int, default=TRACE_BLOCK_SIZE, help="tokens per trace hash id")


def _add_prompt_args(p: argparse.ArgumentParser) -> None:
    """The synthetic prompts: lengths, shared prefixes and the seed."""
    p.add_argument(
        "--input-len",
        type=LengthDist.parse,
        default=LengthDist.parse("256"),
        help="N, uniform:LO:HI or normal:MEAN:STD",
    )
    p.add_argument("--output-len", type=LengthDist.parse, default=LengthDist.parse("128"))
    p.add_argument("--prefix-len", type=int, default=0, help="tokens of shared prefix per group")
    p.add_argument("--prefix-groups", type=int, default=0, help="number of shared-prefix groups")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="prompt seed; a rerun with the same seed sends the same prompts, which a server "
        "with a prefix cache answers from cache: change it for cold prompts",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """How long each run lasts, what each request carries, and the goodput targets."""
    p.add_argument("--num-requests", type=int, default=100, help="at most this many requests per run")
    p.add_argument("--duration", type=float, default=300.0, help="send no request after this many seconds")
    p.add_argument(
        "--grace", type=float, default=30.0, help="seconds in-flight requests get after --duration"
    )
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--warmup", type=int, default=1, help="untimed requests sent one by one before each run")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos")
    p.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into every request")
    p.add_argument("--goodput", nargs="*", help="targets in ms, e.g. ttft=500 itl=50 e2e=5000")


def compare_parser() -> argparse.ArgumentParser:
    p = flags.parser("interlock bench compare", "Lay results files side by side.")
    p.add_argument("files", nargs="+")
    p.add_argument("--png", default="compare.png")
    p.add_argument("--goodput", nargs="*", help="targets in ms (default: each file's own)")
    return flags.apply_environment(p)


async def _first_model(url: str) -> str:
    base = url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"
    async with (
        aiohttp.ClientSession() as s,
        s.get(base + "/models", timeout=aiohttp.ClientTimeout(total=30)) as r,
    ):
        data = await r.json()
    models = data.get("data") or []
    if not models:
        raise ConfigError(f"{base}/models lists no model; pass --model")
    return str(models[0]["id"])


def _plans(args: argparse.Namespace, vocab: Vocab) -> list[LoadPlan]:
    n = args.num_requests
    if args.trace:
        records = load_mooncake(args.trace, limit=n)
        return [
            trace_plan(records, vocab, speedup, args.block_size, args.max_concurrency, source=str(args.trace))
            for speedup in args.speedup
        ]
    spec = SyntheticSpec(args.input_len, args.output_len, args.prefix_len, args.prefix_groups, args.seed)
    spec.validate()
    if args.concurrency:
        return [concurrency_plan(spec, vocab, int(c), n) for c in args.concurrency]
    return [rate_plan(spec, vocab, r, n, args.arrival, args.max_concurrency) for r in args.rate]


def _endpoint(args: argparse.Namespace, model: str, vocab: Vocab) -> Endpoint:
    if args.prompt_as == "ids" and (args.api != "completions" or not vocab.exact):
        raise ConfigError("--prompt-as ids needs --api completions and --tokenizer")
    return Endpoint(
        url=args.url,
        model=model,
        api=args.api,
        send_token_ids=args.prompt_as == "ids",
        ignore_eos=not args.no_ignore_eos,
        request_timeout_s=args.request_timeout,
        extra_body=args.extra_body,
    )


async def _run_all(args: argparse.Namespace, argv: list[str]) -> int:
    vocab = load_vocab(args.tokenizer)
    model = args.model or await _first_model(args.url)
    endpoint = _endpoint(args, model, vocab)
    bounds = Bounds(args.num_requests, args.duration, args.grace)
    bounds.validate()
    targets = parse_targets(args.goodput)
    now = datetime.now(UTC)
    out = Path(args.out or f"bench-{now:%Y%m%d-%H%M%S}.json")
    meta: dict[str, Any] = {
        "url": args.url,
        "model": model,
        "api": args.api,
        "date": now.isoformat(timespec="seconds"),
        "command": ["interlock", "bench", *argv],
        "tokenizer": args.tokenizer,
        "exact_lengths": vocab.exact,
    }
    runs: list[RunResult] = []
    for plan in _plans(args, vocab):
        for w in await warm_up(endpoint, plan, args.warmup, timeout_s=args.duration + args.grace):
            if w.error in ("connect_error", "timeout"):
                raise ConfigError(
                    f"warm-up request to {endpoint.path} failed: {w.error} {w.error_detail or ''}"
                )
            if not w.ok:
                print(f"warm-up request failed: {w.error} {w.error_detail or ''}", file=sys.stderr)
        before = await scrape(args.url)
        run = await run_load(endpoint, plan, bounds, progress=not args.no_progress)
        after = await scrape(args.url) if before is not None else None
        run.server = None if before is None or after is None else figures(before, after)
        runs.append(run)
        print(summary_table(summarize(run.records, run.duration_s, targets), title=f"== {plan.label} =="))
        print(server_table(run.server))
        save(out, meta, runs, targets)  # after every run: a long sweep keeps what it measured
    if len(runs) > 1:
        print(
            compare_table(
                [r.label for r in runs],
                [summarize(r.records, r.duration_s, targets) for r in runs],
                [r.server for r in runs],
            )
        )
    print(f"results: {out}")
    if not args.no_plot:
        png = Path(args.png or out.with_suffix(".png"))
        title = f"interlock bench: {args.url} ({model}), {now:%Y-%m-%d %H:%M} UTC"
        report_png(png, [PlotRun(r.label, "sweep", r) for r in runs], title)
        print(f"report: {png}")
    return 0


def _compare(argv: list[str]) -> int:
    args = compare_parser().parse_args(argv)
    files: list[BenchFile] = [load(f) for f in args.files]
    override = parse_targets(args.goodput) if args.goodput else None
    labels, summaries, plot_runs, server = [], [], [], []
    for f in files:
        stem = Path(f.path).stem
        for run in f.runs:
            label = f"{stem}:{run.label}" if len(files) > 1 else run.label
            labels.append(label)
            summaries.append(summarize(run.records, run.duration_s, override or f.targets))
            server.append(run.server)
            plot_runs.append(PlotRun(label, stem, run))
    print(compare_table(labels, summaries, server))
    endpoints = ", ".join(dict.fromkeys(f"{f.meta.get('url')} ({f.meta.get('model')})" for f in files))
    dates = ", ".join(dict.fromkeys(str(f.meta.get("date", ""))[:10] for f in files))
    report_png(args.png, plot_runs, f"interlock bench compare: {endpoints}, {dates}")
    print(f"report: {args.png}")
    return 0


def _event_loop_run(coro: Any) -> int:
    try:
        import uvloop  # cheaper per request: the generator shares the machine with the server
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str]) -> int:
    try:
        if argv and argv[0] == "compare":
            return _compare(argv[1:])
        if argv and argv[0] == "fake-server":
            from interlock.bench import fake_server

            return fake_server.main(argv[1:])
        args = run_parser().parse_args(argv)
        return _event_loop_run(_run_all(args, argv))
    except ConfigError as exc:
        print(f"interlock bench: {exc.message}", file=sys.stderr)
        return 2
