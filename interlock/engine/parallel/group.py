"""A worker that runs its model on ``T x P`` ranks: the driver's side.

The worker process is rank 0, the driver: it keeps everything a one-process worker has (the
scheduler, the one KV block table, the sampler, KV events and load reports: to the rest of
Interlock the group is one worker) and is tensor rank 0 of pipeline stage 0. The other ranks
are child processes (``rank.py``), started when the runner is built and told each step's
chunks over a pipe; each holds its share of the weights and of every KV block (its heads of
its layers), so one block id means the same block on every rank. Per step:

1. the driver writes the step (its chunks, cut into micro-batches when there are stages) to
   every rank;
2. every rank runs its layers over them (``stage.Stage``), adding partial sums within its stage
   and passing hidden states between stages (``comm``);
3. the last stage sends the rows that sample back to the driver, which computes their logits
   and samples as one process does (``TorchRunner``).

Failure: a rank that exits (killed, crashed, or gave up on a collective) takes the group down.
The driver cannot compute without it, so it ends the worker process (``on_lost``: by default a
log line and exit code 70); the frontend then migrates the worker's streams to other workers
(as for any worker that dies) and a supervisor (``interlock serve``) starts it again. A rank
that hangs is found the same way by the collectives' deadline (``timeout_s``). The ranks watch
their driver: they exit when it is gone.

What a group does not do yet: export or import KV blocks (no KV tiers, no shared cache, no
disaggregated roles: refused by the config) and run on more than one host.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from interlock.deploy import DEFAULT_MAX_NUM_BATCHED_TOKENS
from interlock.engine.config import EngineConfig
from interlock.engine.model import LlamaModel, ModelArchConfig, ModelInput, SequenceChunk, blocks_for_budget
from interlock.engine.model.partition import RankShard, partition
from interlock.engine.parallel import micro
from interlock.engine.parallel.comm import (
    SLOT_ELEMENTS,
    GroupLost,
    StageLink,
    connect,
    create_shm,
    load_sync,
)
from interlock.engine.parallel.messages import Micro, RankLaunch, Step, read_frame, write_frame
from interlock.engine.parallel.stage import Stage
from interlock.engine.runners.torch_runner import TorchRunner, resolve_dtype
from interlock.engine.shared_cache import SharedCacheView
from interlock.env import get_env
from interlock.errors import ConfigError, EngineError
from interlock.model_store import resolve_model

log = logging.getLogger(__name__)

EXIT_GROUP_LOST = 70
"""The worker's exit code when a rank of its group is lost."""
TIMEOUT_S = 60.0
"""A collective that waits longer than this for a rank gives up (``GroupLost``)."""
READY_TIMEOUT_S = 900.0
"""How long the driver waits for its ranks to load (a first start measures kernels)."""

OnLost = Callable[[str], None]


def exit_worker(why: str) -> None:
    """The default ``on_lost``: the worker cannot compute any more, so it ends (its streams
    migrate, its supervisor restarts it)."""
    log.critical("model group lost (%s): ending this worker so that its requests move on", why)
    logging.shutdown()
    os._exit(EXIT_GROUP_LOST)


def rank_devices(device: str, ranks: int) -> list[str]:
    """Each rank's device: ``cpu`` for all on a CPU; on CUDA one device a rank, from the
    worker's own (``cuda:2`` with 2 ranks: ``cuda:2``, ``cuda:3``). ConfigError where the host
    has too few (two ranks on one device would fight over its memory and NCCL refuses them)."""
    if not device.startswith("cuda"):
        return [device] * ranks
    import torch

    first = int(device.partition(":")[2] or 0)
    have = torch.cuda.device_count()
    if first + ranks > have:
        raise ConfigError(
            f"a group of {ranks} ranks needs {ranks} CUDA devices from cuda:{first}, one a rank; "
            f"this host has {have}"
        )
    return [f"cuda:{first + r}" for r in range(ranks)]


class RankProcesses:
    """The driver's children: started, told each step, watched, stopped."""

    def __init__(self, launches: Sequence[RankLaunch], fds: Sequence[int], on_lost: OnLost) -> None:
        self._on_lost = on_lost
        self._closing = False
        self.procs: list[subprocess.Popen[bytes]] = []
        self._answers: list[object] = [None] * len(launches)
        self._readers: list[threading.Thread] = []
        try:
            for launch in launches:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "interlock.engine.parallel.rank"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    pass_fds=tuple(fds),
                    # Not in the terminal's process group: a Ctrl-C goes to the worker, which
                    # drains; its ranks end with it (they watch their parent).
                    start_new_session=True,
                )
                self.procs.append(proc)
                assert proc.stdin is not None
                write_frame(proc.stdin, launch)
        except BaseException:
            self.close()
            raise

    def _start_readers(self) -> None:
        if self._readers:
            return

        def read(k: int) -> None:
            out = self.procs[k].stdout
            assert out is not None
            try:
                self._answers[k] = read_frame(out)
            except (OSError, ValueError):  # closed while waiting: the group is being stopped
                pass

        self._readers = [
            threading.Thread(target=read, args=(k,), daemon=True) for k in range(len(self.procs))
        ]
        for t in self._readers:
            t.start()

    def wait_ready(self, timeout_s: float) -> None:
        """Every rank's answer to its launch (one deadline for all); ConfigError with the
        first refusal."""
        self._start_readers()
        deadline = time.monotonic() + timeout_s
        for t in self._readers:
            t.join(max(0.0, deadline - time.monotonic()))
        for k, answer in enumerate(self._answers):
            if answer != "":
                why = answer if isinstance(answer, str) else f"rank {k + 1} did not start in {timeout_s:g} s"
                raise ConfigError(f"the model group could not start: {why}")
        for k, proc in enumerate(self.procs):
            threading.Thread(
                target=self._watch, args=(k + 1, proc), name=f"rank-{k + 1}", daemon=True
            ).start()

    def refusal(self, wait_s: float = 2.0) -> str | None:
        """A rank's reason for not starting, if one said it (or exited) within ``wait_s``:
        what to report when the driver's own start failed waiting for the ranks."""
        self._start_readers()
        deadline = time.monotonic() + wait_s
        for t in self._readers:
            t.join(max(0.0, deadline - time.monotonic()))
        for k, answer in enumerate(self._answers):
            if isinstance(answer, str) and answer:
                return answer
            code = self.procs[k].poll()
            if code is not None and answer is None:
                return f"rank {k + 1} exited with code {code} before it was ready"
        return None

    def send(self, step: Step) -> None:
        for k, proc in enumerate(self.procs):
            assert proc.stdin is not None
            try:
                write_frame(proc.stdin, step)
            except (BrokenPipeError, ValueError) as exc:
                raise GroupLost(f"rank {k + 1} is gone") from exc

    def _watch(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if not self._closing:
            self._on_lost(f"rank {rank} exited with code {code}")

    def close(self) -> None:
        self._closing = True
        for proc in self.procs:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


class GroupRunner(TorchRunner):
    """A ``TorchRunner`` whose forward pass runs on a group of ranks (see the module note)."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        shard: RankShard,
        link: StageLink | None,
        ranks: RankProcesses,
        on_lost: OnLost,
        scratch: Path,
        num_blocks: int,
        block_size: int = 16,
        seed: int | None = None,
        folder: Path | None = None,
    ) -> None:
        super().__init__(model, num_blocks=num_blocks, block_size=block_size, seed=seed, folder=folder)
        self.shard = shard
        self.ranks = ranks
        self.on_lost = on_lost
        self.stage = Stage(model, self.cache, shard, link)
        self._scratch = scratch

    @classmethod
    def from_config(cls, config: EngineConfig, *, on_lost: OnLost = exit_worker) -> GroupRunner:
        m, c, s = config.model, config.cache, config.scheduler
        folder = resolve_model(m.model)
        full = ModelArchConfig.from_folder(folder)
        shards = partition(full, m.tensor_parallel_size, m.pipeline_parallel_size)
        if s.max_model_len > full.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {s.max_model_len} exceeds the model's "
                f"max_position_embeddings {full.max_position_embeddings}"
            )
        devices = rank_devices(m.device, len(shards))
        if devices[0].startswith("cuda"):
            torch.cuda.set_device(devices[0])  # NCCL's rank 0 is on the worker's own device
        dtype = resolve_dtype(folder, m.device, m.dtype)
        num_blocks = c.num_blocks or blocks_for_budget(full, c.block_size, dtype, c.kv_cache_gib)
        env = get_env()
        threads = max(1, (m.num_threads or env.num_threads or os.cpu_count() or 1) // len(shards))
        torch.set_num_threads(threads)
        scratch = Path(tempfile.mkdtemp(prefix="interlock-group-"))
        elements = min(SLOT_ELEMENTS, s.max_num_batched_tokens * full.hidden_size)
        shm = m.device == "cpu" and m.tensor_parallel_size > 1 and load_sync() is not None
        fds = [
            create_shm(m.tensor_parallel_size, elements) if shm else -1
            for _ in range(m.pipeline_parallel_size)
        ]
        launch = dict(
            tensor_size=m.tensor_parallel_size,
            pipeline_size=m.pipeline_parallel_size,
            folder=str(folder),
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=s.max_model_len,
            block_size=c.block_size,
            num_blocks=num_blocks,
            max_rows=s.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            threads=threads,
            kernels=tuple(sorted(env.kernels.items())),
            store=str(scratch / "store"),
            reduce_elements=elements,
            timeout_s=TIMEOUT_S,
            parent_pid=os.getpid(),
        )
        ranks = RankProcesses(
            [
                RankLaunch(rank=r.rank, reduce_fd=fds[r.stage], device=devices[r.rank], **launch)  # type: ignore[arg-type]
                for r in shards[1:]
            ],
            [fd for fd in fds if fd >= 0],
            on_lost,
        )
        try:
            reduce, link = connect(
                shards[0],
                store=str(scratch / "store"),
                reduce_fd=fds[0],
                elements=elements,
                timeout_s=TIMEOUT_S,
                device=torch.device(devices[0]),
            )
            model = LlamaModel.load(
                folder,
                dtype,
                torch.device(devices[0]),
                max_len=s.max_model_len,
                kernels=env.kernels,
                max_rows=s.max_num_batched_tokens,
                shard=shards[0],
            )
            model.reduce = reduce
            ranks.wait_ready(READY_TIMEOUT_S)
            runner = cls(
                model,
                shard=shards[0],
                link=link,
                ranks=ranks,
                on_lost=on_lost,
                scratch=scratch,
                num_blocks=num_blocks,
                block_size=c.block_size,
                seed=m.seed,
                folder=folder,
            )
        except BaseException as exc:
            refusal = ranks.refusal() if not isinstance(exc, ConfigError) else None
            ranks.close()
            shutil.rmtree(scratch, ignore_errors=True)
            if refusal is not None:  # a rank said why it could not start: that, not gloo's timeout
                raise ConfigError(f"the model group could not start: {refusal}") from exc
            raise
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
        log.info(
            "model group of %d ranks (tensor %d x pipeline %d), %d threads each",
            len(shards),
            m.tensor_parallel_size,
            m.pipeline_parallel_size,
            threads,
        )
        return runner

    def _logits(self, chunks: Sequence[SequenceChunk], inputs: ModelInput, rows: list[int]) -> torch.Tensor:
        wire = tuple((list(c.token_ids), c.start_pos, list(c.block_table)) for c in chunks)
        order = None
        if self.shard.pipeline_size == 1:
            step = Step((Micro(wire, tuple(rows)),))
        else:
            parts, order = micro.plan(wire, inputs.last_rows, rows, self.shard.pipeline_size)
            step = Step(parts)
        try:
            self.ranks.send(step)
            answers = self.stage.run(step, built=inputs if order is None else None)
        except GroupLost as exc:
            self.on_lost(str(exc))
            raise
        final = answers[0] if len(answers) == 1 else torch.cat(answers)
        if order is not None:
            final = final.index_select(0, torch.tensor(order, dtype=torch.long, device=final.device))
        return self.model.logits(final)

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None:
        raise _no_kv_moves()

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None:
        raise _no_kv_moves()

    def import_each(self, block_ids: Sequence[int], blocks: Sequence[memoryview]) -> None:
        raise _no_kv_moves()

    def copy_from_shared(
        self,
        view: SharedCacheView,
        src_ids: Sequence[int],
        block_ids: Sequence[int],
        part: tuple[int, int] = (0, 1),
    ) -> None:
        raise _no_kv_moves()

    def close(self) -> None:
        self.ranks.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


def _no_kv_moves() -> EngineError:
    # The driver holds only its share of each block: moving it alone would move a wrong block.
    return EngineError("a worker of several ranks does not export or import KV blocks yet")
