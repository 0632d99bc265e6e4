"""Does a shared KV cache (on a memfd, ``shared_kv_cache``) change the engine's speed?

Two engines with real SmolLM2 (bf16, one thread) in one process, one whose KV cache lies on a
memfd (``CacheConfig.shared_kv_cache``: what a CPU prefill worker gets by default, so a decode
worker of its host copies straight from it) and one on the private anonymous mapping advised
for huge pages (as before). Both answer the same 16 prompts of 256 tokens, first with one
output token (prefill), then with 24 (prefill + decode), in alternating rounds; the engine
thread's CPU time per phase (robust to other load on the machine) and the median of the paired
ratios (shared / private). Where ``shmem_enabled`` allows "advise" the memfd mapping gets huge
pages too (it is advised); the script prints the mode.

``--copies``: instead, the block copies into and out of each cache (what KV tiers and staged
transfers do to the worker's own cache): 64 MiB of scattered SmolLM2 blocks imported and
exported, GB/s (median of 9) against a 64 MiB memcpy.

Usage: ``PYTHONPATH=. python benchmarks/shared_cache_speed.py [--rounds 4] [--copies]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.factory import build_engine
from interlock.model_store import resolve_model
from interlock.protocol import GenerateRequest, SamplingParams


def _engine(folder: str, shared: bool) -> Callable[[list[list[int]], int], None]:
    config = EngineConfig(
        model=ModelConfig(model=folder, dtype="bfloat16", num_threads=1),
        cache=CacheConfig(kv_cache_gib=1.0, enable_prefix_caching=False, shared_kv_cache=shared),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048),
    )
    core = build_engine(config)
    assert (core.runner.shared_region() is not None) == shared
    ids = iter(range(1 << 30))

    def run(prompts: list[list[int]], max_tokens: int) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for p in prompts:
            core.add_request(GenerateRequest(request_id=str(next(ids)), token_ids=tuple(p), sampling=params))
        while core.has_unfinished():
            core.step()

    return run


def copies() -> None:
    import numpy as np
    import torch

    from interlock.engine.model.config import ModelArchConfig
    from interlock.engine.model.kv_cache import PagedKVCache

    arch = ModelArchConfig.from_folder(resolve_model("smollm2", progress=False))
    n = 182  # 64 MiB of bf16 blocks, in a cache twice as large
    caches = {
        k: PagedKVCache(arch, 2 * n, 16, torch.bfloat16, torch.device("cpu"), shared=k == "shared")
        for k in ("private", "shared")
    }
    ids = [int(b) for b in np.random.default_rng(0).permutation(2 * n)[:n]]
    buf = np.random.default_rng(1).integers(0, 255, n * caches["private"].block_nbytes, dtype=np.uint8)
    src, dst = buf.copy(), np.ones_like(buf)
    times: dict[str, list[float]] = {}
    for _ in range(10):  # the first round warms up and is dropped
        for k, c in caches.items():
            for what, fn in (("import", c.import_blocks), ("export", c.export_blocks)):
                t0 = time.perf_counter()
                fn(ids, memoryview(buf if what == "import" else dst))
                times.setdefault(f"{k} {what}", []).append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.setdefault("memcpy", []).append(time.perf_counter() - t0)
    memcpy = statistics.median(times["memcpy"][1:])
    for k, v in times.items():
        med = statistics.median(v[1:])
        print(f"{k:15s} {buf.nbytes / med / 1e9:6.2f} GB/s  {memcpy / med:4.0%} of memcpy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--copies", action="store_true", help="block copies into and out of each cache")
    args = ap.parse_args()
    mode = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    print(f"shmem_enabled: {mode.read_text().strip() if mode.exists() else 'n/a'}")
    if args.copies:
        copies()
        return
    import torch

    torch.set_num_threads(1)
    folder = str(resolve_model("smollm2", progress=False))
    engines = {"private": _engine(folder, False), "shared": _engine(folder, True)}
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(256)] for _ in range(16)]
    for run in engines.values():
        run(prompts[:4], 4)  # warm-up
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name in sorted(engines, reverse=bool(r % 2)):
            for phase, n in (("prefill", 1), ("prefill+decode", 24)):
                t0 = time.thread_time()
                engines[name](prompts, n)
                cpu.setdefault((name, phase), []).append(time.thread_time() - t0)
    for (name, phase), v in cpu.items():
        print(
            f"{name:8s} {phase:15s} CPU s per round {' '.join(f'{x:.2f}' for x in v)}, median {statistics.median(v):.2f}"
        )
    for phase in ("prefill", "prefill+decode"):
        a, b = cpu[("shared", phase)], cpu[("private", phase)]
        paired = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(f"{phase}: shared / private, median paired ratio {paired:.3f}")
    dec = [(x2 - x1) / (y2 - y1) for x1, x2, y1, y2 in zip(
        cpu[("shared", "prefill")], cpu[("shared", "prefill+decode")],
        cpu[("private", "prefill")], cpu[("private", "prefill+decode")], strict=True)]  # fmt: skip
    print(f"decode (the difference): shared / private, median paired ratio {statistics.median(dec):.3f}")


if __name__ == "__main__":
    main()
