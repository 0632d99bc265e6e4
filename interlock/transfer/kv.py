"""Glue between a model runner's block export/import and a transfer, without copies of our own.

The source exports straight into the staged payload; the destination imports straight from the
received payload (for shared memory and in-process: from the source's own pages). Runners are
typed structurally, so this package does not import the engine.

Two ways to stage: ``stage_blocks`` exports everything, then publishes (the descriptor leaves
after the copy); ``publish_blocks`` publishes first and returns a ``BlockExport`` that exports
chunk by chunk, marking each ready, so that the destination's ``BlockImport`` imports chunk k
while the source exports chunk k + 1: end to end, one copy's time plus a chunk instead of two
copies in sequence.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from interlock.protocol.transfer import SharedCacheRegion, TransferDescriptor
from interlock.transfer.agent import TransferAgent
from interlock.transfer.base import (
    DEFAULT_TIMEOUT_S,
    PENDING,
    DestTransfer,
    SourceTransfer,
    TransferState,
    TransferStatus,
)
from interlock.transfer.source import Source

CHUNK_BYTES = 8 << 20
"""Bytes exported between two bytes-ready marks (whole blocks, at least one): the destination
starts after one chunk and trails by one, and each chunk costs a mark, a liveness poll and a
wake-up. Measured 1-32 MiB on the 2 vCPU VM under load (BENCHMARKS.md, transfer bandwidth):
small chunks lost there (1 MiB: 17% of memcpy end to end, against 38% in sequence), where two
copies at once get no more memory bandwidth than one; 8 MiB keeps the chunks few (a 1,000-token
SmolLM2 prompt, 23 MB, is 3 chunks) while the descriptor still leaves before the export."""


class BlockExporter(Protocol):
    kv_block_nbytes: int

    def export_blocks(self, block_ids: Sequence[int], out: memoryview) -> None: ...


class BlockImporter(Protocol):
    kv_block_nbytes: int

    def import_blocks(self, block_ids: Sequence[int], data: memoryview) -> None: ...


def chunk_blocks(block_nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, chunk_bytes // max(1, block_nbytes))


@contextmanager
def _aborting(transfer: SourceTransfer | DestTransfer, reason: str) -> Iterator[None]:
    """Abort ``transfer`` with ``reason`` if the block copy inside fails (then re-raise)."""
    try:
        yield
    except BaseException:
        transfer.abort(reason)
        raise


def _source_for(
    agent: TransferAgent,
    runner: BlockExporter,
    block_ids: Sequence[int],
    timeout_s: float,
    transfer_id: str | None,
) -> Source:
    """A new staged payload sized for ``block_ids``."""
    nbytes = len(block_ids) * runner.kv_block_nbytes
    return agent.create_source(nbytes, timeout_s=timeout_s, transfer_id=transfer_id)


def stage_blocks(
    agent: TransferAgent,
    runner: BlockExporter,
    block_ids: Sequence[int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transfer_id: str | None = None,
) -> tuple[SourceTransfer, TransferDescriptor]:
    """Export ``block_ids`` into a new staged payload and publish it. The blocks may be freed
    as soon as this returns: the payload holds their KV."""
    src = _source_for(agent, runner, block_ids, timeout_s, transfer_id)
    with _aborting(src, "export failed"):
        runner.export_blocks(block_ids, src.buffer)
        return src, src.publish()


class BlockExport:
    """The export of a published payload, chunk by chunk (``publish_blocks``). ``run`` may go on
    another thread than the publish; the blocks must stay allocated until it returns."""

    def __init__(
        self, src: SourceTransfer, runner: BlockExporter, block_ids: Sequence[int], chunk_bytes: int
    ) -> None:
        self.src = src
        self._runner = runner
        self._block_ids = list(block_ids)
        self._buffer = src.buffer
        self._chunk = chunk_blocks(runner.kv_block_nbytes, chunk_bytes)
        self._done = 0

    @property
    def exported(self) -> int:
        """Blocks exported and marked ready so far."""
        return self._done

    def step(self) -> bool:
        """Export the next chunk and mark it ready; False when nothing is left to do (all
        exported, or the transfer ended first: a destination that gave up, a timeout). An
        export error aborts the transfer and raises."""
        size, n = self._runner.kv_block_nbytes, len(self._block_ids)
        if self._done >= n or self.src.poll().finished:
            return False
        i, j = self._done, min(n, self._done + self._chunk)
        with _aborting(self.src, "export failed"):
            self._runner.export_blocks(self._block_ids[i:j], self._buffer[i * size : j * size])
            self.src.mark_ready(j * size)
        self._done = j
        return j < n

    def run(self) -> bool:
        """Export every chunk; False when the transfer ended before all of them were out."""
        while self.step():
            pass
        return self._done == len(self._block_ids) and self.src.poll().state is not TransferState.FAILED


def publish_blocks(
    agent: TransferAgent,
    runner: BlockExporter,
    block_ids: Sequence[int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transfer_id: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    cache_region: SharedCacheRegion | None = None,
    layout: tuple[int, int, str] | None = None,
) -> tuple[SourceTransfer, TransferDescriptor, BlockExport]:
    """Publish a payload for ``block_ids`` before exporting it; the caller sends the descriptor
    on its way, then runs the returned export (the blocks stay allocated until it returns).
    ``cache_region``: the blocks' shared cache, offered for the one copy; the caller then asks
    ``src.claim_kind()`` before it exports: a DIRECT claim needs no export, but the blocks held
    until the transfer ends. ``layout``: the blocks' layout, for the destination to check."""
    src = _source_for(agent, runner, block_ids, timeout_s, transfer_id)
    export = BlockExport(src, runner, block_ids, chunk_bytes)
    return src, src.publish(ready=0, cache_region=cache_region, layout=layout), export


class BlockImport:
    """Imports a pull's payload into ``block_ids`` as its bytes arrive: each ``step`` polls once
    and imports the whole blocks that became ready; DONE once all are imported and the payload
    released. On FAILED the blocks imported so far hold part of the KV: the caller must not use
    them as computed (it recomputes, or frees them)."""

    def __init__(self, dst: DestTransfer, runner: BlockImporter, block_ids: Sequence[int]) -> None:
        self.dst = dst
        self._runner = runner
        self.block_ids = list(block_ids)
        self.imported = 0
        """Blocks imported so far (a prefix of ``block_ids``)."""
        self.status: TransferStatus = PENDING

    def step(self) -> TransferStatus:
        if self.status.finished:
            return self.status
        status = self.dst.poll()
        if status.state is TransferState.FAILED:
            self.status = status
            return status
        size, n = self._runner.kv_block_nbytes, len(self.block_ids)
        ready = n if status.state is TransferState.DONE else min(n, self.dst.progress() // max(1, size))
        if ready > self.imported:
            i = self.imported
            with _aborting(self.dst, "import failed"):
                self._runner.import_blocks(self.block_ids[i:ready], self.dst.payload[i * size : ready * size])
            self.imported = ready
        if status.state is TransferState.DONE:
            self.dst.release()
            self.status = status
        return self.status

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S, idle_s: float = 0.0001) -> TransferStatus:
        """Step until the pull ends (blocking; for callers off the engine thread: tests,
        benchmarks). The pull's own timeout ends it at worst; ``timeout_s`` aborts it sooner."""
        deadline = time.monotonic() + timeout_s
        while True:
            before = self.imported
            if (status := self.step()).finished:
                return status
            if time.monotonic() > deadline:
                self.dst.abort(f"import not done after {timeout_s:g} s")
            elif self.imported == before:
                time.sleep(idle_s)


def import_when_done(dst: DestTransfer, runner: BlockImporter, block_ids: Sequence[int]) -> TransferStatus:
    """Poll once; on DONE import the payload into ``block_ids`` and release it. Returns the
    status (DONE only after the import)."""
    status = dst.poll()
    if status.state is TransferState.DONE:
        with _aborting(dst, "import failed"):
            runner.import_blocks(block_ids, dst.payload)
        dst.release()
    return status
