"""A rank process of a tensor x pipeline group (every rank but the driver): ``python -m``.

It reads its ``RankLaunch`` from stdin, meets the others (``comm.connect``), loads its share of
the model and its part of the KV cache, answers "ready" on stdout (or why it could not), then
runs each ``Step`` the driver writes until its stdin closes. It holds no request state: the
driver's scheduler owns the block table and sends it with every step. It exits when its driver
is gone (stdin closed, or the parent process changed: a driver killed mid-step) and when a
collective fails (``GroupLost``): the driver sees the exit and takes the group down.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import torch

from interlock.engine.model import LlamaModel, ModelArchConfig, PagedKVCache
from interlock.engine.model.partition import partition
from interlock.engine.parallel.comm import GroupLost, connect
from interlock.engine.parallel.messages import RankLaunch, read_frame, write_frame
from interlock.engine.parallel.stage import Stage

log = logging.getLogger("interlock.engine.parallel.rank")

PARENT_CHECK_S = 0.5


def _watch_parent(pid: int) -> None:
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _stage(launch: RankLaunch) -> Stage:
    from pathlib import Path

    folder = Path(launch.folder)
    device = torch.device(launch.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shard = partition(ModelArchConfig.from_folder(folder), launch.tensor_size, launch.pipeline_size)[
        launch.rank
    ]
    reduce, link = connect(
        shard,
        store=launch.store,
        reduce_fd=launch.reduce_fd,
        elements=launch.reduce_elements,
        timeout_s=launch.timeout_s,
        device=device,
    )
    model = LlamaModel.load(
        folder,
        getattr(torch, launch.dtype),
        device,
        max_len=launch.max_model_len,
        kernels=dict(launch.kernels),
        max_rows=launch.max_rows,
        shard=shard,
    )
    model.reduce = reduce
    cache = PagedKVCache(model.config, launch.num_blocks, launch.block_size, model.dtype, device)
    return Stage(model, cache, shard, link)


def main() -> int:
    stdin = sys.stdin.buffer
    # The answer goes on a private copy of stdout; whatever the rank prints goes to stderr, so
    # no print can corrupt a frame or fill a pipe the driver has stopped reading.
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    launch = read_frame(stdin)
    if not isinstance(launch, RankLaunch):
        return 0
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {launch.rank} %(levelname)s %(name)s: %(message)s"
    )
    _watch_parent(launch.parent_pid)
    torch.set_num_threads(launch.threads)
    try:
        stage = _stage(launch)
    except Exception as exc:  # noqa: BLE001 - said to the driver, which refuses to start
        write_frame(stdout, f"rank {launch.rank}: {type(exc).__name__}: {exc}")
        return 1
    write_frame(stdout, "")
    try:
        while (step := read_frame(stdin)) is not None:
            stage.run(step)
    except GroupLost as exc:
        log.error("the group is lost: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
