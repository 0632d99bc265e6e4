"""Worker side of disaggregated serving: stage a prefill's KV, pull it into a decode's blocks.

Prefill side (``kv_transfer.do_remote_decode``): the engine stops the request after its first
token and holds its blocks; on that final output this module publishes a staged payload for the
blocks (``publish_blocks``, on the engine thread between steps) and adds its
``TransferDescriptor`` to the output at once; the export follows on a worker thread, chunk by
chunk, each chunk marked ready as it lands, and the blocks are freed when it ends. A payload of
one chunk or less is exported in the publishing call and its blocks freed there: nothing to
overlap, and no blocks held across another engine call (under a burst of short prompts those
held blocks crowded the prefill worker's pool). So the
descriptor travels to the decode worker while the KV is still being copied, and the decode
side imports the first chunks while the last are exported. The payload lives in the transfer
agent until the decode worker has pulled it, or until its timeout.

Decode side (``kv_transfer.do_remote_prefill`` with a descriptor): the engine parks the request
with its blocks allocated (no batch slot); this module starts the pull at once, and one poller
task per worker polls every pending pull (a poll never blocks). Blocks that arrived are handed
to the engine thread, which imports them into the parked request's blocks
(``import_remote_kv``); once the pull is DONE the rest (``finish_remote_kv``), and then the
payload is released. A failed pull, or no descriptor, makes the engine compute the prompt
locally (``finish_remote_kv(id, None)``; blocks imported so far are overwritten, never used). A
request that ends first (client gone, abort) aborts its pull, which frees the source's payload.

The one copy (same host, the prefill worker's cache shared: ``CacheConfig.shared_kv_cache``):
the descriptor also names the prefill's cache (``cache_region``), and the prefill side holds the
blocks and exports nothing until a destination claims the transfer. A decode worker that can
map that cache (same host, the process alive, ``/proc/<pid>/fd`` openable, the file and the
layout its own) claims it DIRECT and copies the blocks straight from it into the parked
request's blocks (``EngineCore.copy_remote_kv``, on the engine thread between steps, as the
import); the source frees them on DONE, an abort or its timeout (it stops holding only after it
marked the transfer aborted, and the destination checks that mark after its copy, so a copy
of blocks given up meanwhile is thrown away and the prompt computed). Anything else (another
host, a forced transport, a cache it cannot map or of another layout) pulls the staged payload
as before; the source exports it when that claim arrives. Mapped caches are kept per source
(``shared_cache.SharedViews``) and forgotten when the source dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import msgspec

from interlock.engine.async_engine import AsyncEngine
from interlock.engine.core import EngineCore
from interlock.engine.shared_cache import SharedCacheView, SharedViews, copy_parts
from interlock.metrics import tracing
from interlock.protocol import GenerateOutput, GenerateRequest, KVTransferParams
from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import (
    BlockExport,
    DestTransfer,
    SourceTransfer,
    TransferAgent,
    TransferState,
    publish_blocks,
)
from interlock.transfer.dest import DirectDest
from interlock.transfer.kv import CHUNK_BYTES

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pull:
    request_id: str
    dst: DestTransfer | None
    """None: nothing to pull (the prefill side could not stage); compute locally."""
    imported: int = 0
    """Blocks the engine has imported so far (as of the last hand-over); the one copy: parts
    copied (``EngineCore.copy_remote_blocks``)."""
    view: SharedCacheView | None = None
    """The one copy: the source's mapped cache (``dst`` is then a ``DirectDest``)."""
    src_ids: tuple[int, ...] = ()
    """The one copy: the blocks to copy from ``view``."""
    nbytes: int = 0
    """The payload's size (for the transfer figures)."""
    started: float = field(default_factory=time.monotonic)
    span: tracing.Span = tracing.NO_SPAN
    """Its ``kv.transfer`` span, when tracing is on (ended with its outcome)."""


@dataclass(slots=True)
class HandoffCounters:
    staged: int = 0
    """Prefill side: payloads staged for a decode worker to pull."""
    stage_failed: int = 0
    """Prefill side: staging failed (its KV not offered: the decode side computes the prompt)."""
    export_failed: int = 0
    """Published, then the export failed (the transfer is aborted; the decode side computes)."""
    pulled: int = 0
    """Decode side: payloads imported."""
    pull_failed: int = 0
    """Decode side: pulls that failed (the decode worker computed the prompt itself)."""
    pulls_abandoned: int = 0
    """Decode side: pulls given up because the request ended first."""
    blocks_streamed: int = 0
    """Blocks imported while their transfer was still under way (the rest came on DONE)."""
    transports: dict[str, int] = field(default_factory=dict)
    """Pulls ended, by transport ("direct": the one copy)."""
    transfer_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes of pulls that ended with the KV imported, by transport."""
    transfer_s: dict[str, float] = field(default_factory=dict)
    """Seconds from the start of those pulls to their end, by transport."""
    direct_served: int = 0
    """Prefill side: transfers a destination copied straight from this worker's cache."""
    layout_refused: int = 0
    """Decode side: staged payloads of another block layout (dtype), not imported."""
    direct_refused: int = 0
    """Decode side: transfers that offered the one copy and were pulled staged instead (the
    cache could not be mapped, another layout, the claim refused)."""


class KVHandoff:
    """Moves prompt KV between this worker's engine and its peers' (one per worker; owns and
    closes the transfer agent)."""

    def __init__(
        self,
        engine: AsyncEngine,
        agent: TransferAgent,
        *,
        timeout_s: float = 30.0,
        poll_interval_s: float = 0.002,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.engine = engine
        self.agent = agent
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.chunk_bytes = chunk_bytes
        """Bytes exported between two bytes-ready marks (``transfer.kv.CHUNK_BYTES``), and about
        the bytes of one engine call of the one copy (``copy_parts``)."""
        self.counters = HandoffCounters()
        self._pulls: dict[str, _Pull] = {}
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._exports: set[asyncio.Task[None]] = set()
        self._held: set[SourceTransfer] = set()
        """Prefill side: transfers claimed DIRECT whose blocks are held until they end."""
        self.views = SharedViews()
        """Decode side: the prefill caches mapped here, one per source."""

    def num_pending(self) -> int:
        return len(self._pulls)

    def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        kt = req.kv_transfer
        if kt is not None and kt.do_remote_decode:
            return self._prefill(req)
        if kt is not None and kt.do_remote_prefill:
            return self._decode(req)
        return self.engine.generate(req)

    async def close(self) -> None:
        for src in list(self._held):  # their destinations recompute: nobody waits for them
            src.abort("worker closing")
        if self._exports:  # a running export reads the engine's blocks: let it end (bounded)
            await asyncio.wait(list(self._exports), timeout=self.timeout_s)
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        for pull in self._pulls.values():
            if pull.dst is not None:
                pull.dst.abort("worker closing")
        self._pulls.clear()
        self.views.clear()
        self.agent.close()  # the worker owns its agent: staged payloads go with it

    # ---- prefill side ----
    async def _prefill(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        stream = self.engine.generate(req)
        async with contextlib.aclosing(stream):
            async for out in stream:
                if out.kv_transfer is not None:
                    # Shielded: once staging has begun, it must end in an export or a release
                    # even if the caller goes away (a router that gave up on a hung worker):
                    # cancelled between the hold and the export task, the blocks were held for good.
                    staging = asyncio.ensure_future(self._stage(out, out.kv_transfer))
                    self._exports.add(staging)  # type: ignore[arg-type]
                    staging.add_done_callback(self._exports.discard)  # type: ignore[arg-type]
                    out = await asyncio.shield(staging)
                yield out

    async def _stage(self, out: GenerateOutput, kt: KVTransferParams) -> GenerateOutput:
        rid, blocks, agent, timeout = out.request_id, kt.source_block_ids, self.agent, self.timeout_s
        chunk = self.chunk_bytes

        def publish(core: EngineCore) -> tuple[KVTransferParams, BlockExport | None, bool]:
            try:
                _src, desc, export = publish_blocks(
                    agent,
                    core.runner,
                    blocks,
                    timeout_s=timeout,
                    chunk_bytes=chunk,
                    cache_region=core.runner.shared_region(),
                    layout=core.runner.kv_layout(),
                )
                staged = msgspec.structs.replace(kt, descriptor=desc)
                if desc.cache_region is not None:  # the one copy offered: hold until claimed
                    core.keep_held(rid)  # this handoff ends the hold, by the transfer's timeout
                    return staged, export, True
                if desc.nbytes <= chunk:  # one chunk: nothing to overlap; the blocks go at once
                    export.run()
                    core.release_request_kv(rid)
                    return staged, None, False
            except BaseException:
                core.release_request_kv(rid)
                raise
            return staged, export, False

        try:
            staged, export, offered = await self.engine.call(publish)
        except Exception:  # noqa: BLE001 - the decode side then computes the prompt itself
            log.warning("staging the KV of %s failed", rid, exc_info=True)
            self.counters.stage_failed += 1
            return msgspec.structs.replace(out, kv_transfer=msgspec.structs.replace(kt, descriptor=None))
        if export is not None:
            task = asyncio.create_task(self._export(rid, export, offered), name=f"kv-export-{rid}")
            self._exports.add(task)
            task.add_done_callback(self._exports.discard)
        self.counters.staged += 1
        return msgspec.structs.replace(out, kv_transfer=staged)

    async def _export(self, rid: str, export: BlockExport, offered: bool) -> None:
        """Export the published payload off the engine thread (the copy kernel releases the
        GIL), then free the blocks: the payload holds their KV. With the one copy ``offered``,
        first wait for the claim: a DIRECT one exports nothing and holds the blocks until the
        transfer ends (DONE, an abort, the timeout, the destination dead)."""
        src = export.src
        try:
            kind = await self._claimed(src) if offered else "staged"
            if kind == "direct":
                self._held.add(src)
                try:
                    await self._ended(src)
                finally:
                    self._held.discard(src)
                if src.poll().state is TransferState.DONE:
                    self.counters.direct_served += 1
            elif kind == "staged":
                await asyncio.to_thread(export.run)
        except Exception:  # noqa: BLE001 - the transfer is aborted: the decode side computes
            log.warning("exporting the KV of %s failed", rid, exc_info=True)
            self.counters.export_failed += 1
        finally:
            with contextlib.suppress(Exception):  # an engine shut down meanwhile freed them all
                await self.engine.call(lambda core: core.release_request_kv(rid))

    async def _claimed(self, src: SourceTransfer) -> str:
        """How the payload was claimed ("direct" or "staged"), or "" if it ended unclaimed."""
        while not (kind := src.claim_kind()):
            if src.poll().finished:
                return ""
            await asyncio.sleep(self.poll_interval_s)
        return kind

    async def _ended(self, src: SourceTransfer) -> None:
        while not src.poll().finished:
            await asyncio.sleep(self.poll_interval_s)

    # ---- decode side ----
    async def _decode(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        rid = req.request_id
        started = self._pulls[rid] = self._start_pull(req)
        span = tracing.start_span("kv.transfer", parent=req.traceparent)
        if span.is_recording():
            transport = started.dst.transport if started.dst is not None else "none"
            span.set_attributes({"request_id": rid, "bytes": started.nbytes, "transport": transport})
            started.span = span
        self._ensure_poller()
        stream = self.engine.generate(req)
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    yield out
        finally:
            pull = self._pulls.pop(rid, None)
            if pull is not None and pull.dst is not None:
                pull.dst.abort("request ended before its KV arrived")
                self.counters.pulls_abandoned += 1
            if pull is not None:
                _end_span(pull, "abandoned")

    def _start_pull(self, req: GenerateRequest) -> _Pull:
        rid, kt = req.request_id, req.kv_transfer
        desc = kt.descriptor if kt is not None else None
        if desc is None or kt is None:
            return _Pull(rid, None)
        if desc.cache_region is not None and (direct := self._pull_direct(rid, kt, desc)) is not None:
            return direct
        try:
            dst = self.agent.pull(desc, timeout_s=self.timeout_s)
        except Exception:  # noqa: BLE001 - no transport reaches it: compute locally
            log.warning("cannot pull the KV of %s", rid, exc_info=True)
            return _Pull(rid, None)
        mine = self.engine.core.runner.kv_layout()
        if desc.layout is not None and tuple(desc.layout) != mine:
            # Same bytes per block, another meaning (fp16 against bf16): the pull fails as an
            # import would, the source learns it at once and the engine computes the prompt.
            why = f"KV layout {tuple(desc.layout)}, this worker's {mine} (piece, pieces, dtype)"
            log.warning("not importing the KV of %s: %s", rid, why)
            self.counters.layout_refused += 1
            dst.abort(why)
        return _Pull(rid, dst, nbytes=desc.nbytes)

    def _pull_direct(self, rid: str, kt: KVTransferParams, desc: TransferDescriptor) -> _Pull | None:
        """Claim the one copy when this worker can map the source's cache; None: pull staged."""
        region = desc.cache_region
        agent = self.agent
        if region is None or agent.transport is not None or desc.host_id != agent.host_id:
            return None  # another host, or a forced transport: staged, as the source expects
        runner = self.engine.core.runner
        why = runner.region_mismatch(region)
        if not why and len(kt.source_block_ids) * runner.kv_block_nbytes != desc.nbytes:
            why = f"{len(kt.source_block_ids)} source blocks for a payload of {desc.nbytes} bytes"
        view = None
        if not why:
            self.views.prune()
            try:
                view = self.views.get(region)
            except (OSError, ValueError) as e:
                why = f"cannot map the source's cache: {e}"
        if view is not None:
            dst = agent.pull_direct(desc, timeout_s=self.timeout_s)
            if dst.poll().state is not TransferState.FAILED:
                return _Pull(rid, dst, view=view, src_ids=kt.source_block_ids, nbytes=desc.nbytes)
            why = dst.poll().reason
        log.info("KV of %s pulled staged, not copied from the source's cache: %s", rid, why)
        self.counters.direct_refused += 1
        return None

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_loop(), name="kv-handoff-poller")
        self._wake.set()

    async def _poll_loop(self) -> None:
        while True:
            if not self._pulls:
                self._wake.clear()
                await self._wake.wait()
            for pull in list(self._pulls.values()):
                await self._poll_one(pull)
            await asyncio.sleep(self.poll_interval_s)

    async def _poll_one(self, pull: _Pull) -> None:
        dst = pull.dst
        state = dst.poll().state if dst is not None else TransferState.FAILED
        rid = pull.request_id
        if state is TransferState.PENDING and isinstance(dst, DirectDest):
            await self._copy_direct(pull, dst)
            return
        if state is TransferState.PENDING:
            assert dst is not None
            await self._import_arrived(pull, dst)
            return
        data = dst.payload if dst is not None and state is TransferState.DONE else None
        try:
            handed = await self.engine.call(lambda core: _hand_over(core, rid, data))
        except Exception:  # noqa: BLE001 - import failed: the engine computes the prompt
            log.exception("importing the KV of %s failed", rid)
            await self.engine.call(lambda core: core.finish_remote_kv(rid, None))
            handed, data = True, None
        if handed:
            self._ended_pull(pull, data is not None)

    def _ended_pull(self, pull: _Pull, ok: bool) -> None:
        """The engine has the KV (``ok``) or computes the prompt: release or abort the pull."""
        dst = pull.dst
        if self._pulls.get(pull.request_id) is not pull:
            return
        del self._pulls[pull.request_id]
        if dst is not None:
            dst.release() if ok else dst.abort("pull failed")
            c, t = self.counters, dst.transport
            c.transports[t] = c.transports.get(t, 0) + 1
            if ok:
                c.transfer_bytes[t] = c.transfer_bytes.get(t, 0) + pull.nbytes
                c.transfer_s[t] = c.transfer_s.get(t, 0.0) + time.monotonic() - pull.started
        if ok:
            self.counters.pulled += 1
        else:
            self.counters.pull_failed += 1
        _end_span(pull, "imported" if ok else "failed")

    async def _copy_direct(self, pull: _Pull, dst: DirectDest) -> None:
        """The one copy, on the engine thread once the request is parked, chunk by chunk; DONE
        if the source held the blocks all through it, else the engine computes the prompt."""
        rid, view, src_ids = pull.request_id, pull.view, pull.src_ids
        assert view is not None
        s = self.engine.core.scheduler  # a hint read off the engine thread (checked again there)
        req = s.requests.get(rid)
        if req is None or (req.awaiting_kv and rid not in s.remote_parked):
            return  # not added or not parked yet: no engine call for nothing (every 2 ms)
        size = self.engine.core.runner.kv_block_nbytes
        parts = copy_parts(len(src_ids) * size, self.chunk_bytes)
        try:
            # One part (a slice of every block) per engine call, the last one with the hold's
            # check: other requests' steps run in between, as between the chunks of a streamed
            # import.
            while pull.imported + 1 < parts:
                upto = pull.imported + 1
                done = await self.engine.call(functools.partial(_copy_parts, rid, view, src_ids, upto, parts))
                if self._pulls.get(rid) is not pull:
                    return  # the request ended meanwhile (its pull was aborted)
                if done < upto:
                    break  # no longer parked: ``copy_remote_kv`` says what became of it
                pull.imported = done
            copied = await self.engine.call(lambda core: core.copy_remote_kv(rid, view, src_ids, dst.holding))
        except Exception:  # noqa: BLE001 - the engine computes the prompt
            log.exception("copying the KV of %s from its source's cache failed", rid)
            await self.engine.call(lambda core: core.finish_remote_kv(rid, None))
            copied = False
        if copied is not None:
            self._ended_pull(pull, copied)

    async def _import_arrived(self, pull: _Pull, dst: DestTransfer) -> None:
        """Hand the blocks that arrived since the last time to the engine (streamed payloads:
        imported while the rest is on its way)."""
        size = self.engine.core.runner.kv_block_nbytes
        ready = dst.progress() // size if size else 0
        if ready <= pull.imported:
            return
        try:
            data = dst.payload
        except RuntimeError:
            return  # it failed meanwhile: the next poll hands that over
        rid = pull.request_id
        try:
            imported = await self.engine.call(lambda core: core.import_remote_kv(rid, data, ready))
            self.counters.blocks_streamed += max(0, imported - pull.imported)
            pull.imported = imported
        except Exception:  # noqa: BLE001 - the pull fails: the engine computes the prompt
            log.exception("importing the KV of %s failed", rid)
            dst.abort("import failed")


def _copy_parts(
    request_id: str, view: SharedCacheView, src_ids: tuple[int, ...], upto: int, parts: int, core: EngineCore
) -> int:
    return core.copy_remote_blocks(request_id, view, src_ids, upto, parts)


def _end_span(pull: _Pull, outcome: str) -> None:
    if pull.span.is_recording():
        pull.span.set_attribute("outcome", outcome)
        pull.span.end()


def _hand_over(core: EngineCore, request_id: str, data: memoryview | None) -> bool:
    """On the engine thread: import ``data`` into the parked request (None: compute locally).
    False while the request is not ready for it yet (not added, or its blocks not allocated)."""
    req = core.scheduler.requests.get(request_id)
    if req is None:
        return False
    if not req.awaiting_kv:
        return True  # the engine gave up waiting and computes the prompt itself
    if data is not None and request_id not in core.scheduler.remote_parked:
        return False
    core.finish_remote_kv(request_id, data)
    return True
