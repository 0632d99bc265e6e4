"""KV tiers (issue 14): onboarding bandwidth, the Mooncake replay with tiers, SmolLM2 end to end.

    PYTHONPATH=. .venv/bin/python benchmarks/kv_tiers.py bandwidth [--mib 64] [--cache-gib 1] [--runs 15]
    PYTHONPATH=. .venv/bin/python benchmarks/kv_tiers.py replay [--speedup 7.5]
    PYTHONPATH=. .venv/bin/python benchmarks/kv_tiers.py e2e [--sessions 8] [--rounds 4]
    PYTHONPATH=. .venv/bin/python benchmarks/kv_tiers.py pages [--rounds 6]

bandwidth  The engine's own copy paths on SmolLM2-135M-shaped blocks (bf16, 368,640 B) in a
           real ``PagedKVCache`` of ``--cache-gib`` (default 1 GiB, a worker's default
           ``CacheConfig.kv_cache_gib``; filled once), ``--mib`` of scattered block ids (as after
           churn), against raw baselines of the same bytes, interleaved rounds, medians. The
           cache's size matters: a block is 180 pieces of 2 KiB, each a run stride (num_blocks
           x 2 KiB) apart, so the larger the cache the sparser the pieces and the costlier the
           page walks; the header says how much of the cache's mapping got huge pages
           (AnonHugePages). ``--shared-cache``: the cache on a memfd, as a worker that may serve
           prefill to another keeps it (role prefill, or both without a KV tier; shared memory
           gets no huge pages where ``shmem_enabled`` is "never"):
             host -> device   ``KVTiers`` onboarding (``start_load``, the I/O job run inline,
                              ``poll``): host-tier slots into device blocks (one
                              ``import_each`` call, as the tier I/O thread makes) vs one
                              ``np.copyto`` of the same bytes
             disk -> device   the same from the disk tier: block files (header + checksum
                              check, into one reused buffer) block by block into device blocks vs a
                              raw ``readinto`` of the same bytes from one file (page cache warm)
             device -> host   ``KVTiers.offload`` of evicted blocks into host slots vs memcpy
             export / import  ``export_blocks`` / ``import_blocks`` of the whole run (the
                              disaggregation path around a shared-memory transfer) vs memcpy
replay     The Mooncake conversation trace, 8 workers of 61,000 blocks of 64 tokens (together
           about a third of the distinct blocks), with and without one host tier as large as
           the 8 pools together (shared by the 8 workers of the host); hit ratio against one
           shared LRU of the same total size, TTFT p99.
pages      Whether the KV cache's huge pages (``PagedKVCache`` on CPU) change the engine's speed:
           two engines with real SmolLM2 (bf16, one thread), one whose cache is on huge pages
           (as shipped) and one on ``torch.zeros`` (4 KiB pages), in one process, answering the
           same 16 prompts of 256 tokens with 24 output tokens each, in alternating rounds; the
           engine thread's CPU time per round (robust to other load on the machine) and the
           median of the paired ratios.
e2e        The engine with real SmolLM2 (bf16, this CPU): multi-turn sessions whose working set
           is about 4x the device pool; sessions take turns so others push each one out;
           TTFT of returning turns with a host tier against without. ``--http``: the same
           through ``interlock serve --workers 1`` (its own nats-server, worker process,
           frontend) and the official ``openai`` client, streaming, token-id prompts; the
           assistant's answer in the history is then random tokens of the answer's length.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


# ---- bandwidth ----
def bandwidth(args: argparse.Namespace) -> None:
    import torch

    from interlock.engine.block_pool import Evicted
    from interlock.engine.config import CacheConfig
    from interlock.engine.model.config import ModelArchConfig
    from interlock.engine.model.kv_cache import PagedKVCache
    from interlock.engine.scheduler import LoadOrder
    from interlock.engine.tiers import DiskTier, HostTier, KVTiers, ManualIO
    from interlock.model_store import resolve_model

    arch = ModelArchConfig.from_folder(resolve_model("smollm2", progress=False))
    nbytes_block = PagedKVCache(arch, 1, 16, torch.bfloat16, torch.device("cpu")).block_nbytes
    n = max(1, args.mib * (1 << 20) // nbytes_block)
    gib = CacheConfig.kv_cache_gib if args.cache_gib is None else args.cache_gib
    cache_blocks = int(gib * (1 << 30)) // nbytes_block  # as blocks_for_budget
    if cache_blocks < n:
        raise SystemExit(f"--cache-gib {gib} holds {cache_blocks} blocks, fewer than the {n} copied")
    cache = PagedKVCache(
        arch, cache_blocks, 16, torch.bfloat16, torch.device("cpu"), shared=args.shared_cache
    )
    cache.tensor.view(torch.int16).random_(generator=torch.Generator().manual_seed(0))  # in place

    class Copier:  # the runner's side of a copy (TorchRunner delegates to its cache the same way)
        kv_block_nbytes = nbytes_block
        export_blocks = cache.export_blocks
        import_blocks = cache.import_blocks
        import_each = cache.import_each

    rng = np.random.default_rng(0)
    device_ids = [int(b) for b in rng.permutation(cache_blocks)[:n]]  # scattered, as after churn
    evicted = [Evicted(b, 1000 + i, None) for i, b in enumerate(device_ids)]
    hashes = tuple(e.block_hash for e in evicted)
    targets = tuple(int(b) for b in rng.permutation(cache_blocks)[:n])
    total = n * nbytes_block
    src = np.empty(total, np.uint8)
    src[:] = 1
    dst = np.empty(total, np.uint8)
    dst[:] = 0
    staged = bytearray(total)
    tmp = Path(tempfile.mkdtemp(prefix="kvtiers-bw-"))
    (tmp / "raw").write_bytes(src.tobytes())
    # The engine's own paths (KVTiers, tiers filled by offload, loads through the I/O queue),
    # with the queue run inline: what the tier I/O thread does, timed on this thread.
    host_io, disk_io = ManualIO(), ManualIO()
    host_tiers = KVTiers(Copier(), host_io, host=HostTier(n, nbytes_block))
    disk_tiers = KVTiers(Copier(), disk_io, disk=DiskTier(tmp / "disk", n, nbytes_block, "bench", disk_io))
    disk_tiers.offload(evicted)
    disk_io.run_pending()
    disk_tiers.poll()
    # Offload into a host tier allocated once (its memory touched by the warm-up round), as in a
    # running engine; a fresh tier per round timed its page faults (~2x the copy itself).
    offload_tiers = KVTiers(Copier(), ManualIO(), host=HostTier(n, nbytes_block))
    host_tiers.offload(evicted)

    def memcpy() -> None:
        np.copyto(dst, src)

    def raw_read() -> None:
        with open(tmp / "raw", "rb") as f:
            f.readinto(memoryview(dst))

    def load(tiers: KVTiers, io: ManualIO) -> None:
        tiers.start_load(LoadOrder("bench", targets, hashes))
        io.run_pending()
        (done,) = tiers.poll()
        assert done.num_loaded == n, done

    def host_to_device() -> None:
        load(host_tiers, host_io)

    def disk_to_device() -> None:
        load(disk_tiers, disk_io)

    def device_to_host() -> None:
        offload_tiers.clear()
        offload_tiers.offload(evicted)

    def export() -> None:
        cache.export_blocks(device_ids, memoryview(staged))

    def import_() -> None:
        cache.import_blocks(targets, memoryview(staged))

    cases = {
        "memcpy": memcpy,
        "raw file read": raw_read,
        "host -> device": host_to_device,
        "disk -> device": disk_to_device,
        "device -> host": device_to_host,
        "export (disagg)": export,
        "import (disagg)": import_,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn()  # warm: page cache, first touch
    for _ in range(args.runs):
        for k, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    raw_of = {
        "host -> device": "memcpy",
        "disk -> device": "raw file read",
        "device -> host": "memcpy",
        "export (disagg)": "memcpy",
        "import (disagg)": "memcpy",
    }
    print(
        f"{n} blocks of {nbytes_block:,} B = {total / (1 << 20):.1f} MiB scattered in a KV cache of "
        f"{cache_blocks} blocks = {cache_blocks * nbytes_block / 2**30:.2f} GiB"
        f"{', shared (memfd)' if args.shared_cache else ''} "
        f"(AnonHugePages of its mapping: {_huge_kib(cache.tensor.data_ptr())} kB), median of {args.runs}; "
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| path | GB/s (median) | min..max GB/s | vs raw (ratio of medians) | vs raw (median paired ratio) |"
    )
    print("|---|---|---|---|---|")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        cols = ["", ""]
        if k in raw_of:
            raw = raw_of[k]
            paired = statistics.median(r / t for r, t in zip(times[raw], v, strict=True))
            cols = [f"{med[raw] / med[k]:.0%} of {raw}", f"{paired:.0%}"]
        print(
            f"| {k} | {total / med[k] / 1e9:.2f} | {total / max(v) / 1e9:.2f}..{total / min(v) / 1e9:.2f} "
            f"| {cols[0]} | {cols[1]} |"
        )
    for t in (host_tiers, disk_tiers, offload_tiers):
        t.close()
    shutil.rmtree(tmp)


def _huge_kib(addr: int) -> str:
    """AnonHugePages of this process's mapping that holds ``addr`` ("?" where unknown)."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return "?"
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return line.split()[1]
    return "?"


# ---- huge pages A/B ----
def pages(args: argparse.Namespace) -> None:
    import random

    import torch

    from benchmarks.engine_cpu import _interlock
    from interlock.engine.model import kv_cache
    from interlock.model_store import resolve_model

    folder = str(resolve_model("smollm2", progress=False))
    torch.set_num_threads(1)
    engines = {"huge pages": _interlock(folder, 1)[1]}
    shipped = kv_cache._huge_page_zeros
    kv_cache._huge_page_zeros = lambda shape, dtype: (None, torch.zeros(shape, dtype=dtype))  # type: ignore[assignment,misc,return-value]
    try:
        engines["4 KiB pages"] = _interlock(folder, 1)[1]
    finally:
        kv_cache._huge_page_zeros = shipped
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(256)] for _ in range(16)]
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for generate in engines.values():
        generate(prompts[:4], 4)  # warm-up
    for r in range(args.rounds):
        for name in sorted(engines, reverse=bool(r % 2)):
            t0 = time.thread_time()
            engines[name](prompts, 24)
            cpu[name].append(time.thread_time() - t0)
    for name, v in cpu.items():
        print(
            f"{name}: engine-thread CPU s per round {' '.join(f'{x:.2f}' for x in v)}, median {statistics.median(v):.2f}"
        )
    paired = statistics.median(a / b for a, b in zip(cpu["huge pages"], cpu["4 KiB pages"], strict=True))
    print(f"huge pages / 4 KiB pages, median paired ratio: {paired:.3f}")


# ---- replay ----
def replay_tiers(args: argparse.Namespace) -> None:
    from interlock.mooncake import load_mooncake
    from interlock.router import RouterConfig
    from interlock.sim import ReplayConfig, TraceHasher, mooncake_requests, replay

    records = load_mooncake(args.trace)
    reqs = mooncake_requests(records, block_size=64, speedup=args.speedup, hasher=TraceHasher(64))
    distinct = len({h for r in reqs for h in r.block_hashes})
    print(
        f"trace: {len(reqs)} requests, {distinct:,} distinct 64-token blocks; "
        f"pools {args.workers} x {args.blocks:,} = {args.workers * args.blocks / distinct:.0%} of them; "
        f"arrivals x{args.speedup}; host load {args.host_load_ms} ms/block\n"
    )
    rows = []
    for name, host in (("no tiers", 0), ("host tier", args.workers * args.blocks)):
        cfg = ReplayConfig(
            num_workers=args.workers,
            num_blocks=args.blocks,
            block_size=64,
            host_kv_blocks=host,
            workers_per_host=args.workers,
            host_load_s_per_block=args.host_load_ms / 1000,
            router=RouterConfig(policy="kv", seed=0),
        )
        rep = replay(reqs, cfg)
        rows.append((name, host, rep))
    print(
        "| setup | total blocks | hit ratio | pooled LRU bound (same total) | of bound | "
        "infinite bound | TTFT p50 / p99 ms | replay wall s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, host, rep in rows:
        total = args.workers * args.blocks + host
        print(
            f"| {name} | {total:,} | {rep.hit_ratio:.3f} | {rep.pooled_bound:.3f} | "
            f"{rep.hit_ratio / rep.pooled_bound:.1%} | {rep.upper_bound:.3f} | "
            f"{rep.ttft_p50_ms:,.0f} / {rep.ttft_p99_ms:,.0f} | {rep.wall_s:.1f} |"
        )
    print(f"\nTTFT p99 without / with tiers: {rows[0][2].ttft_p99_ms / rows[1][2].ttft_p99_ms:.2f}x")


# ---- end to end ----
def e2e(args: argparse.Namespace) -> None:
    import asyncio

    from interlock.engine.async_engine import AsyncEngine
    from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from interlock.engine.factory import build_engine
    from interlock.model_store import resolve_model
    from interlock.protocol import GenerateRequest, SamplingParams

    folder = str(resolve_model("smollm2", progress=False))
    bs = 16
    rng = np.random.default_rng(1)
    # Each session: a long context, then short user turns; the answer is appended to the history.
    contexts = [list(rng.integers(300, 40000, args.context)) for _ in range(args.sessions)]
    pool_blocks = args.sessions * (args.context + args.rounds * (args.turn + args.output)) // bs // 4

    async def run(host_gib: float) -> tuple[list[float], list[float], dict[str, int]]:
        config = EngineConfig(
            model=ModelConfig(model=folder, runner="torch", dtype="bfloat16"),
            cache=CacheConfig(block_size=bs, num_blocks=pool_blocks, watermark=0.0, host_kv_gib=host_gib),
            scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=4096),
        )
        core = build_engine(config)
        engine = AsyncEngine(core)
        history = [list(c) for c in contexts]
        first: list[float] = []
        returning: list[float] = []
        for rnd in range(args.rounds):
            for s in range(args.sessions):
                history[s] += list(rng.integers(300, 40000, args.turn))
                req = GenerateRequest(
                    request_id=f"{host_gib}-{rnd}-{s}",
                    token_ids=tuple(int(t) for t in history[s]),
                    sampling=SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True),
                )
                t0 = time.perf_counter()
                ttft = None
                async for out in engine.generate(req):
                    if ttft is None and out.token_ids:
                        ttft = time.perf_counter() - t0
                    history[s] += list(out.token_ids)
                assert ttft is not None
                (returning if rnd else first).append(ttft)
        stats = {t.tier: t.loads for t in core.load.kv_tiers}
        await engine.shutdown()
        return first, returning, stats

    print(
        f"{args.sessions} sessions, context {args.context} tokens, {args.rounds} rounds of "
        f"+{args.turn} user / +{args.output} output tokens; device pool {pool_blocks} blocks of {bs} "
        f"(working set ~4x); host tier {args.host_gib} GiB\n"
    )
    results = {}
    for name, gib in (("no tiers", 0.0), ("host tier", args.host_gib)):
        results[name] = asyncio.run(run(gib))
    print("| setup | first turns TTFT p50 ms | returning TTFT p50 / p99 ms | host loads (blocks) |")
    print("|---|---|---|---|")
    for name, (first, ret, stats) in results.items():
        print(
            f"| {name} | {np.percentile(first, 50) * 1000:.0f} | {np.percentile(ret, 50) * 1000:.0f} / "
            f"{np.percentile(ret, 99) * 1000:.0f} | {stats.get('host', 0)} |"
        )
    a, b = results["no tiers"][1], results["host tier"][1]
    print(
        f"\nreturning turns TTFT p50 without / with: {np.percentile(a, 50) / np.percentile(b, 50):.2f}x, "
        f"p99 {np.percentile(a, 99) / np.percentile(b, 99):.2f}x"
    )


def e2e_http(args: argparse.Namespace) -> None:
    import socket
    import subprocess
    import sys
    import urllib.request

    from openai import OpenAI

    bs = 16
    rng = np.random.default_rng(1)
    contexts = [[int(t) for t in rng.integers(300, 40000, args.context)] for _ in range(args.sessions)]
    turns = [
        [[int(t) for t in rng.integers(300, 40000, args.turn + args.output)] for _ in range(args.sessions)]
        for _ in range(args.rounds)
    ]
    pool_blocks = args.sessions * (args.context + args.rounds * (args.turn + args.output)) // bs // 4

    def run(host_gib: float) -> tuple[list[float], list[float]]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "interlock.cli.main",
            "serve",
            "--workers",
            "1",
            "--port",
            str(port),
            "--num-blocks",
            str(pool_blocks),
            "--block-size",
            str(bs),
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            "8",
        ]
        if host_gib:
            cmd += ["--host-kv-gib", str(host_gib)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("server did not start")
                time.sleep(0.5)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            model = client.models.list().data[0].id
            history = [list(c) for c in contexts]
            first: list[float] = []
            returning: list[float] = []
            for rnd in range(args.rounds):
                for s in range(args.sessions):
                    history[s] += turns[rnd][s][: args.turn]
                    t0 = time.perf_counter()
                    ttft = None
                    stream = client.completions.create(
                        model=model, prompt=history[s], max_tokens=args.output, temperature=0.0, stream=True
                    )
                    for chunk in stream:
                        if ttft is None and chunk.choices and chunk.choices[0].text:
                            ttft = time.perf_counter() - t0
                    assert ttft is not None
                    (returning if rnd else first).append(ttft)
                    history[s] += turns[rnd][s][args.turn :]
            return first, returning
        finally:
            proc.terminate()
            proc.wait(60)

    print(
        f"HTTP: {args.sessions} sessions, context {args.context} tokens, {args.rounds} rounds of "
        f"+{args.turn} user / +{args.output} answer tokens; device pool {pool_blocks} blocks of {bs}; "
        f"host tier {args.host_gib} GiB\n"
    )
    results = {name: run(gib) for name, gib in (("no tiers", 0.0), ("host tier", args.host_gib))}
    print("| setup | first turns TTFT p50 ms | returning TTFT p50 / p99 ms |")
    print("|---|---|---|")
    for name, (first, ret) in results.items():
        print(
            f"| {name} | {np.percentile(first, 50) * 1000:.0f} | {np.percentile(ret, 50) * 1000:.0f} / "
            f"{np.percentile(ret, 99) * 1000:.0f} |"
        )
    a, b = results["no tiers"][1], results["host tier"][1]
    print(
        f"\nreturning turns TTFT p50 without / with: {np.percentile(a, 50) / np.percentile(b, 50):.2f}x, "
        f"p99 {np.percentile(a, 99) / np.percentile(b, 99):.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bandwidth")
    b.add_argument("--mib", type=int, default=64)
    b.add_argument(
        "--cache-gib", type=float, default=None, help="the KV cache, GiB (default: a worker's default)"
    )
    b.add_argument("--runs", type=int, default=15)
    b.add_argument("--shared-cache", action="store_true", help="the cache on a memfd (a prefill worker's)")
    r = sub.add_parser("replay")
    r.add_argument("--trace", default=TRACE)
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--blocks", type=int, default=61_000)
    r.add_argument("--speedup", type=float, default=7.5)
    r.add_argument(
        "--host-load-ms",
        type=float,
        default=0.4,
        help="one 64-token block of a 70B-class GQA model (~21 MB) at ~50 GB/s",
    )
    e = sub.add_parser("e2e")
    e.add_argument("--sessions", type=int, default=8)
    e.add_argument("--rounds", type=int, default=4)
    e.add_argument("--context", type=int, default=400)
    e.add_argument("--turn", type=int, default=40)
    e.add_argument("--output", type=int, default=16)
    e.add_argument("--host-gib", type=float, default=1.0)
    e.add_argument("--http", action="store_true", help="through interlock serve and the openai client")
    pg = sub.add_parser("pages")
    pg.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.cmd == "e2e" and args.http:
        e2e_http(args)
        return
    {"bandwidth": bandwidth, "replay": replay_tiers, "e2e": e2e, "pages": pages}[args.cmd](args)


if __name__ == "__main__":
    main()
