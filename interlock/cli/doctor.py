"""``interlock doctor link``: bandwidth and round-trip time of KV-transfer links.
``interlock doctor kernels``: the model dtype ``auto`` picks here (bf16 or fp32, measured), and
which kernel each operation of a model (linear layers, attention
by kind, element-wise kernels) uses per size on this machine, with the timings it was chosen
from (measured now if not cached; ``scripts/setup.sh`` measures the default model ahead).

Without ``--peer`` it starts a second local process and measures every transport between the
two (in-process within this one; shared memory and TCP to the other), which is what a
prefill/decode pair on one host sees. ``--serve`` runs a bare transfer agent to be measured from
another host with ``--peer HOST:PORT``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import signal
import sys
import time
from dataclasses import asdict
from multiprocessing.connection import Connection

from interlock.cli import flags
from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS
from interlock.errors import TransferError
from interlock.names import DTYPES
from interlock.transfer import LinkStats, TransferAgent, measure_link

KV_BLOCK_NBYTES = 30 * 2 * 3 * 64 * 16 * 2
"""One SmolLM2-135M KV block (bf16, 16 tokens): the default probe block."""


def build_parser() -> argparse.ArgumentParser:
    ap = flags.parser("interlock doctor", "Check the KV-transfer links and the kernels this machine uses.")
    sub = ap.add_subparsers(dest="check", required=True)
    link = sub.add_parser("link", help="bandwidth and RTT between two transfer agents")
    link.add_argument("--peer", help="HOST:PORT of a running agent (default: start a local one)")
    link.add_argument("--serve", action="store_true", help="run an agent to be measured, until Ctrl-C")
    link.add_argument("--host", default="127.0.0.1", help="bind address for this side's agent")
    link.add_argument("--port", type=int, default=0)
    link.add_argument("--advertise-host", default=None, help="address peers use to reach this agent")
    link.add_argument("--block-bytes", type=int, default=KV_BLOCK_NBYTES)
    link.add_argument("--blocks", type=int, default=64)
    link.add_argument("--repeats", type=int, default=5)
    link.add_argument("--timeout", type=float, default=30.0)
    link.add_argument("--json", action="store_true", help="one JSON object per link instead of a table")
    kernels = sub.add_parser("kernels", help="the kernel chosen per operation and size on this machine")
    kernels.add_argument("--model", default="smollm2", help="model name or folder (default smollm2)")
    kernels.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    kernels.add_argument(
        "--max-rows",
        type=int,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="largest row count measured (serve measures up to --max-num-batched-tokens)",
    )
    kernels.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="the model dtype to check (default auto: as serve)"
    )
    kernels.add_argument(
        "--summary", action="store_true", help="the chosen ranges without the timings (what setup prints)"
    )
    return flags.apply_environment(ap)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check == "kernels":
        return _kernels(args)
    agent = TransferAgent(host=args.host, port=args.port, advertise_host=args.advertise_host)
    try:
        if args.serve:
            return _serve(agent)
        return _check(agent, args)
    finally:
        agent.close()


def _kernels(args: argparse.Namespace) -> int:
    import logging

    import torch

    from interlock.engine.model import dtype_choice
    from interlock.engine.model.config import ModelArchConfig
    from interlock.engine.model.dispatch import kernel_table
    from interlock.env import get_env
    from interlock.model_store import resolve_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    config = ModelArchConfig.from_folder(resolve_model(args.model))
    env = get_env()
    choice = dtype_choice.resolve(
        args.dtype, torch.device("cpu"), config, cache_dir=env.cache_dir, fused=env.cpu_kernels
    )
    print(f"model dtype: {choice.why}", flush=True)
    logging.getLogger("interlock.engine.model.kernel_choice").setLevel(logging.WARNING)  # printed below
    table = kernel_table(
        config,
        choice.dtype,
        torch.device("cpu"),
        fused=True,
        kernels={},
        max_rows=args.max_rows,
        progress=lambda line: print(line, flush=True),
    )
    if table is None:
        print(
            f"no choice to make here: the model runs in {str(choice.dtype).removeprefix('torch.')} and no "
            "fused CPU kernels for it run here (plain PyTorch path, oneDNN for every layer)"
        )
        return 0
    text = table.describe()
    if args.summary:
        text = "\n".join(line for line in text.splitlines() if "measured (us per call)" not in line)
    print(text)
    return 0


def _serve(agent: TransferAgent) -> int:
    print(f"transfer agent listening on {agent.tcp_address}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def _check(agent: TransferAgent, args: argparse.Namespace) -> int:
    if args.peer:
        return _report(
            {"auto": _measure(agent, args.peer, None, args), "tcp": _measure(agent, args.peer, "tcp", args)},
            args,
        )
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    peer = ctx.Process(target=_local_peer, args=(child_conn,), daemon=True)
    peer.start()
    try:
        if not conn.poll(30):
            print("local peer did not start", file=sys.stderr)
            return 1
        address = conn.recv()
        return _report(
            {
                "inproc": _measure(agent, agent.tcp_address, None, args),
                "shm": _measure(agent, address, "shm", args),
                "tcp": _measure(agent, address, "tcp", args),
            },
            args,
        )
    finally:
        conn.send("exit")
        peer.join(10)
        if peer.is_alive():
            peer.kill()


def _local_peer(conn: Connection) -> None:
    with TransferAgent() as agent:
        conn.send(agent.tcp_address)
        conn.recv()


def _measure(
    agent: TransferAgent, address: str, transport: str | None, args: argparse.Namespace
) -> LinkStats | str:
    try:
        return measure_link(
            agent,
            address,
            transport=transport,
            block_nbytes=args.block_bytes,
            num_blocks=args.blocks,
            repeats=args.repeats,
            timeout_s=args.timeout,
        )
    except TransferError as e:
        return str(e)


def _report(results: dict[str, LinkStats | str], args: argparse.Namespace) -> int:
    nbytes = args.block_bytes * args.blocks
    if args.json:
        for name, r in results.items():
            print(
                json.dumps(
                    {"link": name, **asdict(r)} if isinstance(r, LinkStats) else {"link": name, "error": r}
                )
            )
    else:
        print(
            f"payload: {args.blocks} blocks x {args.block_bytes} B = {nbytes / 2**20:.1f} MiB, "
            f"median of {args.repeats}"
        )
        print(f"{'link':<8} {'transport':<10} {'GB/s':>8} {'RTT us':>9} {'est. ms':>9}")
        for name, r in results.items():
            if isinstance(r, LinkStats):
                print(
                    f"{name:<8} {r.transport:<10} {r.bandwidth_bytes_per_s / 1e9:>8.2f} "
                    f"{r.rtt_s * 1e6:>9.0f} {r.transfer_time_s(nbytes) * 1e3:>9.2f}"
                )
            else:
                print(f"{name:<8} FAILED: {r}")
    return 0 if all(isinstance(r, LinkStats) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
