"""asyncio at the edge, a synchronous step loop inside: the engine's client.

One dedicated thread owns the ``EngineCore`` and runs its step loop (the model runner releases
the GIL while it computes). Clients on an event loop talk to that thread only through a command
queue (add, abort, any call on the core) and get their outputs through one asyncio queue per
request, fed with ``loop.call_soon_threadsafe``. A client that goes away (generator closed or
cancelled) becomes an explicit abort, executed before the next step. The thread sleeps on a
condition variable when there is nothing to do, and wakes for a command or a KV timeout.

After each step the loop hands the step's KV events and load report to a ``KVEventSink`` (the
publisher seam), on the event loop that started the engine, so sinks may use asyncio freely.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import sys
import threading
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from interlock.engine.core import EngineCore, StepResult, error_info
from interlock.engine.serving import KVEventSink, NullKVEventSink
from interlock.engine.stats import EngineStats
from interlock.errors import EngineError, InvalidRequest, ServiceUnavailable
from interlock.metrics import tracing
from interlock.protocol import GenerateOutput, GenerateRequest, KVEvent, LoadReport
from interlock.runtime.channel import Channel

log = logging.getLogger(__name__)
_Outputs = Channel[GenerateOutput]
"""One stream's outputs on its client's loop (the reader takes a whole turn's arrivals at once)."""
T = TypeVar("T")

_IDLE_WAIT_S = 0.005
"""Pause after a step that could schedule nothing (e.g. waiting for blocks held for transfer)."""
_MAX_WAIT_S = 1.0
_PR_SET_TIMERSLACK = 29
_IDLE_CHECK_AFTER_S = 0.25
"""Idle this long before the pool's integrity check runs."""


_Stream = tuple[asyncio.AbstractEventLoop, _Outputs]


class AsyncEngine:
    """Interlock's engine behind the seam (``engine.serving.ServingEngine``)."""

    name = "interlock"

    def engine_stats(self) -> EngineStats:
        """Preemptions and per-request queue and prefill times (``engine.stats``)."""
        return self.core.scheduler.stats

    def __init__(self, core: EngineCore, *, sink: KVEventSink | None = None) -> None:
        self.core = core
        self._sink: KVEventSink = sink or NullKVEventSink()
        self._cv = threading.Condition()
        self._commands: deque[Callable[[], object]] = deque()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._load = core.load
        self._dirty = False
        """A step ran since the last idle integrity check."""

    # ---- the seam ----
    @property
    def block_size(self) -> int:
        return self.core.block_size

    @property
    def kv_blocks_total(self) -> int:
        return self.core.pool.num_blocks

    @property
    def context_length(self) -> int:
        return self.core.config.scheduler.max_model_len

    async def kv_snapshot(self) -> list[KVEvent]:
        """The whole cache as events, taken on the engine thread between steps."""
        return await self.call(lambda core: core.kv_snapshot())

    async def kv_state(self) -> dict[str, list[int]]:
        """The whole cache as block hashes by tier, taken on the engine thread between steps."""
        return await self.call(lambda core: core.kv_state())

    async def pool_status(self) -> tuple[int, int, str]:
        return await self.call(pool_figures)

    async def load_weights(self) -> float:
        """Bring offloaded weights back now, between two steps (the router's prefetch); seconds
        it took, 0 if they were in. The report that says they are in goes out at once."""

        def load(core: EngineCore) -> float:
            took = core.load_weights()
            if took:
                self._publish_load(core.load)
            return took

        return await self.call(load)

    def announce(self) -> dict[str, str]:
        return {}  # the KV hand-off (engine.disagg) announces its own agent

    def handoff_counts(self) -> dict[str, int]:
        return {}

    def problem(self) -> str | None:
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stopping:
            return "the engine thread has stopped"
        return None

    # ---- lifecycle ----
    def start(self, sink: KVEventSink | None = None) -> None:
        """Start the step thread; call from the event loop that should receive sink calls
        (``sink``, when given, replaces the one given at construction)."""
        if sink is not None:
            self._sink = sink
        if self._thread is not None:
            return
        if self._stopping:
            raise ServiceUnavailable("the engine is shut down")
        self._loop = asyncio.get_running_loop()
        self.core.set_wakeup(self._wake)
        self._thread = threading.Thread(target=self._run, name="interlock-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the loop, wait for the thread, end every open stream with an error."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
            streams, self._streams = dict(self._streams), {}
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.core.close)
        err = error_info(ServiceUnavailable("the engine shut down"))
        for rid, (loop, q) in streams.items():
            out = GenerateOutput(request_id=rid, finish_reason="abort", error=err)
            _deliver(loop, q, out)

    def load(self) -> LoadReport:
        """Load figures of the latest step."""
        return self._load

    # ---- client calls ----
    async def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        """Stream the outputs of ``req`` until a finished one; closing the stream aborts it.

        A request with ``kv_transfer.do_remote_prefill`` is parked until its KV is handed over
        with ``call(lambda core: core.finish_remote_kv(request_id, data))``.
        """
        self.start()
        rid = req.request_id
        q = _Outputs()
        with self._cv:
            refused: Exception | None = None
            if self._stopping:
                refused = ServiceUnavailable("the engine is shut down")
            elif rid in self._streams:
                refused = InvalidRequest(f"duplicate request id {rid!r}", param="request_id")
            else:
                self._streams[rid] = (asyncio.get_running_loop(), q)
        if refused is not None:
            yield GenerateOutput(request_id=rid, finish_reason="error", error=error_info(refused))
            return
        span = tracing.start_span("engine", parent=req.traceparent)
        first = span.is_recording()  # still to mark the first token on the span
        self._submit(lambda: self.core.add_request(req))
        finished = False
        try:
            while not finished:
                out = await q.get()
                finished = out.finished
                if first and out.token_ids:
                    first = False
                    span.add_event("first_token")
                    span.set_attributes(
                        {"prompt_tokens": out.num_prompt_tokens, "cached_tokens": out.num_cached_tokens}
                    )
                yield out
        finally:
            with self._cv:
                self._streams.pop(rid, None)
            if not finished:
                self.abort(rid)
            if span.is_recording():
                span.set_attribute("finish_reason", out.finish_reason if finished else "abort")
                span.end()

    def abort(self, request_id: str) -> None:
        """Abort a request (its stream, if still open, gets a final ``abort`` output)."""
        self._submit(lambda: self.core.abort(request_id))

    async def call(self, fn: Callable[[EngineCore], T]) -> T:
        """Run ``fn(core)`` on the engine thread between two steps and return its result."""
        self.start()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn(self.core))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

        self._submit(run)
        return await asyncio.wrap_future(fut)

    def _wake(self) -> None:
        """From another thread (tier I/O): something may be ready; end an idle pause."""
        with self._cv:
            self._cv.notify()

    def _submit(self, command: Callable[[], object]) -> None:
        with self._cv:
            if self._stopping:
                return
            self._commands.append(command)
            self._cv.notify()

    # ---- the engine thread ----
    def _run(self) -> None:
        core = self.core
        _precise_sleeps()
        while True:
            commands = self._wait_for_work()
            if commands is None:
                return
            for command in commands:
                try:
                    command()
                except Exception:  # noqa: BLE001 - one bad command never stops the loop
                    log.exception("engine command failed")
            if not core.has_work() and not self._deadline_passed():
                if core.idle():  # the weights left: the router prices their return now
                    self._publish_load(core.load)
                continue
            try:
                result = core.step()
            except Exception as exc:  # noqa: BLE001 - an engine bug: fail requests, keep going
                log.exception("engine step failed")
                self._fail_all(exc)
                continue
            self._dirty = True
            self._publish(result)
            if not result.outputs and result.load.tokens_computed == 0:
                with self._cv:  # blocked (no blocks, no slot): do not spin
                    if not self._commands and not self._stopping:
                        self._cv.wait(_IDLE_WAIT_S)

    def _wait_for_work(self) -> list[Callable[[], object]] | None:
        """Commands to run now, after sleeping while idle; None when stopping."""
        if self._dirty and not self.core.has_work() and self._quiet_for(_IDLE_CHECK_AFTER_S):
            # Idle for a while: a cheap moment to verify the pool. Not at once on going idle:
            # the check holds the GIL for milliseconds, which would delay the event loop
            # sending the last tokens out, and a request arriving right after.
            self._check_integrity()
        with self._cv:
            while not self._stopping and not self._commands and not self.core.has_work():
                if self._deadline_passed() or self.core.offload_due():
                    break
                self._cv.wait(self._idle_timeout())
            if self._stopping:
                return None
            commands = list(self._commands)
            self._commands.clear()
            return commands

    def _quiet_for(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a command; True if none came and no deadline is due."""
        with self._cv:
            if not self._commands and not self._stopping:
                self._cv.wait(min(seconds, self._idle_timeout()))
            return not self._commands and not self._stopping and not self._deadline_passed()

    def _check_integrity(self) -> None:
        self._dirty = False
        try:
            self.core.check_integrity()
        except AssertionError:
            log.exception("engine state is inconsistent")

    def _idle_timeout(self) -> float:
        deadline = self.core.next_deadline()
        if deadline is None:
            return _MAX_WAIT_S
        return min(_MAX_WAIT_S, max(0.0, deadline - self.core.clock.now()))

    def _deadline_passed(self) -> bool:
        deadline = self.core.next_deadline()
        return deadline is not None and deadline <= self.core.clock.now()

    def _publish(self, result: StepResult) -> None:
        self._load = result.load
        # One wake-up per client loop per step, not one per output.
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Outputs, GenerateOutput]]] = {}
        with self._cv:
            for out in result.outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    batches.setdefault(stream[0], []).append((stream[1], out))
        loop = self._loop
        for client_loop, items in batches.items():
            if client_loop is loop:
                continue  # delivered with the sink calls below, in the same wake-up
            try:
                client_loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the client's loop is closed
                pass
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._on_step, batches.get(loop), result.kv_events, result.load)
        except RuntimeError:  # the loop is closed: nobody to publish to
            pass

    def _publish_load(self, load: LoadReport) -> None:
        """A load report outside a step (weights offloaded or brought back), on the engine's loop."""
        self._load = load
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._sink_call, self._sink.on_load, load)
        except RuntimeError:  # the loop is closed: nobody to publish to
            pass

    def _on_step(
        self,
        items: list[tuple[_Outputs, GenerateOutput]] | None,
        kv_events: list[KVEvent],
        load: LoadReport,
    ) -> None:
        """On the engine's loop: outputs first, then the step's KV events and load report."""
        if items:
            _put_all(items)
        if kv_events:
            self._sink_call(self._sink.on_kv_events, kv_events)
        self._sink_call(self._sink.on_load, load)

    @staticmethod
    def _sink_call(fn: Callable[[T], None], arg: T) -> None:
        try:
            fn(arg)
        except Exception:  # noqa: BLE001 - a publisher fault must not reach the engine
            log.exception("KV event sink failed")

    def _fail_all(self, exc: Exception) -> None:
        err = error_info(EngineError(f"engine step failed: {exc}"))
        with self._cv:
            streams = dict(self._streams)
        for rid, (loop, q) in streams.items():
            try:
                self.core.abort(rid)
            except Exception:  # noqa: BLE001
                log.exception("abort after a failed step failed")
            _deliver(loop, q, GenerateOutput(request_id=rid, finish_reason="error", error=err))


def pool_figures(core: EngineCore) -> tuple[int, int, str]:
    """(used blocks, total blocks, integrity error or ""), on the engine thread."""
    try:
        core.check_integrity()
        err = ""
    except AssertionError as exc:
        err = str(exc) or "integrity check failed"
    return core.pool.num_used_blocks, core.pool.num_blocks, err


def _precise_sleeps() -> None:
    """Give the engine thread a 1 µs timer slack (Linux; the default is 50 µs).

    The thread sleeps in short waits between steps (and the mock runner sleeps its modelled
    step time, a few µs at high speed-ups); with the default slack each of those took ~50 µs
    longer than asked, once per step."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no prctl: keep the default
        pass


def _deliver(loop: asyncio.AbstractEventLoop, q: _Outputs, out: GenerateOutput) -> None:
    try:
        loop.call_soon_threadsafe(q.put, out)
    except RuntimeError:  # the client's loop is closed
        pass


def _put_all(items: list[tuple[_Outputs, GenerateOutput]]) -> None:
    for q, out in items:
        q.put(out)
