"""fp32 linear layers: oneDNN-packed weights against ``F.linear``, weights streamed from memory.

Usage: ``.venv/bin/python benchmarks/linear_packing.py [--rows 1,8,32,256] [--layers 30]``

Times all the linear layers of SmolLM2-135M's shape (per layer: qkv 960x576, o 576x576,
gate_up 3072x576, down 576x1536; ``--layers`` of them, distinct weights, so that a step streams
them from memory as the model's does) at each row count, through ``engine.model.linear.Linear``
with the plan ``onednn`` (packed once) and ``torch`` (``F.linear``), best of three passes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from interlock.engine.model.kernel_choice import Plan  # noqa: E402
from interlock.engine.model.linear import Linear  # noqa: E402

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,32,256")
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(*s, generator=gen) * 0.02 for _ in range(args.layers) for s in SHAPES]
    layers = {
        impl: [Linear(w, fused=False, plan=Plan.only(impl)) for w in weights] for impl in ("onednn", "torch")
    }
    served = {impl: {lin.kernel_for(8) for lin in lins} for impl, lins in layers.items()}
    print(f"kernels serving each plan: {served}; torch threads {torch.get_num_threads()}")
    print("| rows | onednn (packed) ms | torch (F.linear) ms | torch / onednn |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {k: torch.randn(rows, k, generator=gen) for k in {s[1] for s in SHAPES}}
        best = {}
        for impl, lins in layers.items():
            times = []
            for _ in range(3):
                t = time.perf_counter()
                for lin, w in zip(lins, weights, strict=True):
                    lin(inputs[w.shape[1]])
                times.append(time.perf_counter() - t)
            best[impl] = min(times) * 1e3
        print(
            f"| {rows} | {best['onednn']:.1f} | {best['torch']:.1f} | {best['torch'] / best['onednn']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
