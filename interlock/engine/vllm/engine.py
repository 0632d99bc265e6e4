"""vLLM's async engine behind the worker's seam (``engine.serving.ServingEngine``).

vLLM's ``AsyncLLM`` runs in the worker process (its engine core in a child process, as vLLM
always does); this adapter translates at its edge and no vLLM type crosses it:
- requests: ``GenerateRequest`` (token ids, Interlock's sampling) into vLLM's ``TokensPrompt``
  and ``SamplingParams`` (delta outputs, no detokenization: the frontend detokenizes); a
  migrated request's ``resume_token_ids`` are appended to the prompt and taken off
  ``max_tokens``, so greedy output continues exactly (a seeded draw does not: vLLM restarts its
  generator; Interlock's engine continues at (seed, i));
- outputs: vLLM's ``RequestOutput`` deltas into ``GenerateOutput`` (cached tokens, logprobs);
  errors into Interlock's error tree (a dead engine is 503, so the router migrates);
- KV events: vLLM's ZMQ publisher (``ipc://`` in a private directory: vLLM binds, the adapter
  subscribes) through ``events.Translator``; a gap is filled from vLLM's replay socket;
- load: a vLLM stat logger (running, waiting, KV usage, tokens per iteration) into
  ``LoadReport``s with measured prefill speed and decode step time;
- health: ``problem()`` is vLLM's ``errored`` (its engine core process died).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from interlock.engine.config import EngineConfig
from interlock.engine.serving import KVEventSink, NullKVEventSink
from interlock.engine.vllm.args import vllm_engine_args
from interlock.engine.vllm.events import Translator
from interlock.errors import ConfigError, EngineError, InterlockError, InvalidRequest, ServiceUnavailable
from interlock.protocol import ErrorInfo, GenerateOutput, GenerateRequest, KVEvent, LoadReport, TokenLogprobs

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "vLLM is not installed in this environment: on a CPU machine `./scripts/setup.sh --vllm` "
    "(vLLM's CPU build), on a GPU machine `pip install vllm` (docs/vllm.md)"
)
_END_SEQ = -1
_REPLAY_TIMEOUT_S = 2.0
_EMA = 0.2
"""Weight of the newest sample in the measured prefill speed and decode step time."""


def _guest_environment(config: EngineConfig) -> None:
    """vLLM reads these from the environment; set before it is imported (a value already set
    by the operator wins). Nothing may be downloaded at run time, so the hub is offline."""
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if config.model.device == "cpu":
        cores = len(os.sched_getaffinity(0))
        threads = config.model.num_threads
        defaults["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"  # the worker's own loop needs little
        if threads and threads < cores:
            # Several workers share this host's cores: no pinning (each would pin the same
            # cores), each computing on its share.
            defaults["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            defaults["OMP_NUM_THREADS"] = str(threads)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def _error(rid: str, exc: BaseException) -> GenerateOutput:
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        err: InterlockError = ServiceUnavailable(f"vLLM's engine died: {exc}")
    elif isinstance(exc, (ValueError, TypeError)):
        err = InvalidRequest(f"vLLM refused the request: {exc}")
    elif isinstance(exc, InterlockError):
        err = exc
    else:
        err = EngineError(f"vLLM failed the request: {type(exc).__name__}: {exc}")
    info = ErrorInfo(
        type=type(err).__name__, message=str(err), status=err.status, param=getattr(err, "param", None)
    )
    return GenerateOutput(request_id=rid, finish_reason="error", error=info)


class VllmEngine:
    name = "vllm"

    def __init__(self, llm: Any, config: EngineConfig, workdir: str, endpoints: tuple[str, str]) -> None:
        self._llm = llm
        self._config = config
        self._workdir = workdir
        self._endpoints = endpoints
        cache = llm.vllm_config.cache_config
        self._block_size = int(cache.block_size)
        self._num_blocks = int(cache.num_gpu_blocks or 0)
        self._context_length = int(llm.vllm_config.model_config.max_model_len)
        self._priority = llm.vllm_config.scheduler_config.policy == "priority"
        self._sink: KVEventSink = NullKVEventSink()
        self._translator = Translator(self._block_size)
        self._events_task: asyncio.Task[None] | None = None
        self._last_iteration = 0.0
        self._prefill_tps = 0.0
        self._decode_step_s = 0.0
        self._busy_s = 0.0
        self._pending_prefill: dict[str, int] = {}
        """Requests without their first token yet: uncomputed prompt tokens (an upper bound)."""
        self._load = self._report(0, 0, 0.0, 0.0, 0)

    # ---- construction ----
    @classmethod
    async def create(cls, config: EngineConfig, *, instance_id: str = "") -> VllmEngine:
        """Start vLLM for ``config`` (tens of seconds; minutes when it compiles)."""
        _guest_environment(config)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(f"{INSTALL_HINT} ({exc})") from exc
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        kwargs = vllm_engine_args(config, known)
        workdir = tempfile.mkdtemp(prefix=f"interlock-vllm-{instance_id or os.getpid()}-")
        endpoints = (f"ipc://{workdir}/kv-events", f"ipc://{workdir}/kv-replay")
        kwargs["kv_events_config"] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoints[0],
            "replay_endpoint": endpoints[1],
            "topic": "kv",
        }
        holder: list[VllmEngine] = []
        started = time.monotonic()
        try:
            args = AsyncEngineArgs(**kwargs)
            llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(holder)])
        except Exception as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            if isinstance(exc, (ValueError, TypeError)):
                raise ConfigError(f"vLLM refused its engine arguments: {exc}") from exc
            raise
        engine = cls(llm, config, workdir, endpoints)
        holder.append(engine)
        log.info(
            "vLLM engine ready in %.1fs: block size %d, %d KV blocks, context %d",
            time.monotonic() - started,
            engine.block_size,
            engine.kv_blocks_total,
            engine.context_length,
        )
        return engine

    # ---- the seam ----
    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def kv_blocks_total(self) -> int:
        return self._num_blocks

    @property
    def context_length(self) -> int:
        return self._context_length

    def start(self, sink: KVEventSink) -> None:
        self._sink = sink
        if self._events_task is None:
            self._events_task = asyncio.create_task(self._events_loop(), name="vllm-kv-events")

    def problem(self) -> str | None:
        if self._llm.errored:
            return "vLLM's engine core is dead"
        return None

    def load(self) -> LoadReport:
        return self._load

    async def kv_snapshot(self) -> list[KVEvent]:
        return self._translator.snapshot()

    async def pool_status(self) -> tuple[int, int, str]:
        return self._load.kv_blocks_used, self._num_blocks, ""

    async def shutdown(self) -> None:
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._events_task
            self._events_task = None
        await asyncio.to_thread(self._llm.shutdown)
        shutil.rmtree(self._workdir, ignore_errors=True)

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        rid = req.request_id
        try:
            prompt, params = self._vllm_request(req)
        except InterlockError as exc:
            yield _error(rid, exc)
            return
        self._pending_prefill[rid] = len(req.token_ids)
        n_prompt = len(req.token_ids)
        try:
            stream = self._llm.generate(prompt, params, rid, priority=req.priority if self._priority else 0)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    self._pending_prefill.pop(rid, None)
                    yield self._output(rid, out, n_prompt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error output
            log.warning("vLLM request %s failed: %s", rid, exc)
            yield _error(rid, exc)
        finally:
            self._pending_prefill.pop(rid, None)

    # ---- translation ----
    def _vllm_request(self, req: GenerateRequest) -> tuple[Any, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if req.kv_transfer is not None:
            raise ServiceUnavailable("this vLLM worker does not take part in disaggregation (docs/vllm.md)")
        s = req.sampling
        done = len(req.resume_token_ids)
        if done >= s.max_tokens:
            raise InvalidRequest("resume_token_ids already reach max_tokens", param="max_tokens")
        params = SamplingParams(
            max_tokens=s.max_tokens - done,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,
            min_p=s.min_p,
            seed=s.seed,
            stop_token_ids=list(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
            min_tokens=max(0, s.min_tokens - done),
            logprobs=s.logprobs,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        return TokensPrompt(prompt_token_ids=[*req.token_ids, *req.resume_token_ids]), params

    def _output(self, rid: str, out: Any, n_prompt: int) -> GenerateOutput:
        o = out.outputs[0]
        finish = o.finish_reason if out.finished else None
        if finish is not None and finish not in ("stop", "length", "abort"):
            finish = "stop" if finish == "stop_string" else "abort"
        return GenerateOutput(
            request_id=rid,
            token_ids=tuple(o.token_ids),
            logprobs=_logprobs(o.token_ids, o.logprobs) if o.logprobs is not None else None,
            finish_reason=finish,
            num_prompt_tokens=n_prompt,
            num_cached_tokens=min(n_prompt, int(out.num_cached_tokens or 0)),
        )

    # ---- KV events ----
    async def _events_loop(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(self._endpoints[0])
        try:
            while True:
                _topic, seq_b, payload = await sub.recv_multipart()
                await self._on_batch(int.from_bytes(seq_b, "big"), payload)
        finally:
            sub.close(linger=0)

    async def _on_batch(self, seq: int, payload: bytes) -> None:
        tr = self._translator
        gap = tr.check(seq)
        if gap is not None:
            replayed = await self._replay(gap.first, gap.upto)
            if replayed is None:
                log.warning(
                    "vLLM KV events %d..%d lost: the router forgets this worker's blocks",
                    gap.first,
                    gap.upto - 1,
                )
                self._publish(tr.reset(seq))
            else:
                for rseq, rpayload in replayed:
                    self._publish(tr.feed(rseq, _decode_events(rpayload)))
        self._publish(tr.feed(seq, _decode_events(payload)))

    async def _replay(self, first: int, upto: int) -> list[tuple[int, bytes]] | None:
        """Batches ``first`` .. ``upto - 1`` from vLLM's replay buffer, or None."""
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.connect(self._endpoints[1])
        got: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart((b"", first.to_bytes(8, "big")))
            while await sock.poll(int(_REPLAY_TIMEOUT_S * 1000)):
                frames = await sock.recv_multipart()
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == _END_SEQ:
                    break
                if first <= seq < upto:
                    got.append((seq, frames[3]))
        finally:
            sock.close(linger=0)
        got.sort()
        if [s for s, _ in got] != list(range(first, upto)):
            return None
        return got

    def _publish(self, events: list[KVEvent]) -> None:
        if events:
            self._sink.on_kv_events(events)

    # ---- load ----
    def _on_stats(self, scheduler: Any, iteration: Any) -> None:
        now = time.monotonic()
        tokens, prompt = 0, 0
        if iteration is not None:
            prompt = int(iteration.num_prompt_tokens)
            tokens = prompt + int(iteration.num_generation_tokens)
        step = now - self._last_iteration if self._last_iteration else 0.0
        busy = scheduler is not None and (scheduler.num_running_reqs or scheduler.num_waiting_reqs)
        if tokens and 0 < step < 5.0:
            self._busy_s += step
            if prompt >= self._block_size:
                rate = prompt / step
                self._prefill_tps = (
                    rate if not self._prefill_tps else (1 - _EMA) * self._prefill_tps + _EMA * rate
                )
            elif not prompt:
                self._decode_step_s = (
                    step if not self._decode_step_s else (1 - _EMA) * self._decode_step_s + _EMA * step
                )
        self._last_iteration = now if busy else 0.0
        if scheduler is None:
            return
        used = round(scheduler.kv_cache_usage * self._num_blocks)
        self._load = self._report(scheduler.num_running_reqs, scheduler.num_waiting_reqs, step, used, tokens)
        self._sink.on_load(self._load)

    def _report(self, running: int, waiting: int, step: float, used: float, tokens: int) -> LoadReport:
        return LoadReport(
            instance_id="",
            timestamp=time.time(),
            num_running=int(running),
            num_waiting=int(waiting),
            kv_blocks_used=int(used),
            kv_blocks_total=self._num_blocks,
            queued_prefill_tokens=sum(self._pending_prefill.values()),
            step_time_s=step,
            tokens_computed=tokens,
            prefill_tokens_per_s=self._prefill_tps,
            decode_step_s=self._decode_step_s,
            busy_s=self._busy_s,
        )


_batch_decoder = msgspec.msgpack.Decoder()


def _decode_events(payload: bytes) -> list[dict[str, Any]]:
    """vLLM's batch ``[timestamp, [events], dp_rank]``: each event a map with a ``type`` tag."""
    batch = _batch_decoder.decode(payload)
    events = batch[1] if isinstance(batch, list) and len(batch) > 1 else []
    return [e for e in events if isinstance(e, dict)]


def _logprobs(token_ids: Any, entries: Any) -> tuple[TokenLogprobs, ...]:
    out = []
    for tok, entry in zip(token_ids, entries, strict=False):
        ranked = sorted(
            ((lp.rank or 0, tid, lp.logprob) for tid, lp in entry.items() if tid != tok or lp.rank),
            key=lambda r: r[0],
        )
        chosen = entry.get(tok)
        top = tuple((tid, float(lp)) for rank, tid, lp in ranked if rank >= 1)
        out.append(TokenLogprobs(int(tok), float(chosen.logprob) if chosen is not None else 0.0, top))
    return tuple(out)


def _stat_logger_factory(holder: list[VllmEngine]) -> Any:
    """A vLLM per-engine stat logger class that hands each record to the adapter."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _ToAdapter(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if holder:
                holder[0]._on_stats(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _ToAdapter
