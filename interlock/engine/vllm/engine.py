"""vLLM's async engine behind the worker's seam (``engine.serving.ServingEngine``).

vLLM's ``AsyncLLM`` runs in the worker process (its engine core in a child process, as vLLM
always does); this adapter translates at its edge and no vLLM type crosses it:
- requests: ``GenerateRequest`` (token ids, Interlock's sampling) into vLLM's ``TokensPrompt``
  and ``SamplingParams``, every sampling field mapped (``vllm.sampling``: penalties, logit bias,
  structured outputs; delta outputs, no detokenization: the frontend detokenizes); a migrated
  request's ``resume_token_ids`` are appended to the prompt and taken off ``max_tokens``, so
  greedy output continues exactly (a seeded draw does not: vLLM restarts its generator;
  Interlock's engine continues at (seed, i); nor does one with a frequency or presence penalty,
  which vLLM counts over its own output only);
- outputs: vLLM's ``RequestOutput`` deltas into ``GenerateOutput`` (cached tokens, logprobs,
  prompt logprobs: vLLM sends them all with the first delta, as Interlock's engine does; vLLM
  skips its prefix cache for such a request itself, and a decode leg taking its KV from a
  prefill worker is refused, as by Interlock's engine);
  errors into Interlock's error tree (a dead engine is 503, so the router migrates);
- KV events: vLLM's ZMQ publisher (``ipc://`` in a private directory: vLLM binds, the adapter
  subscribes) through ``events.Translator``; a gap is filled from vLLM's replay socket;
- load: a vLLM stat logger (running, waiting, KV usage, tokens per iteration) into
  ``LoadReport``s with measured prefill speed and decode step time;
- health: ``problem()`` is vLLM's ``errored`` (its engine core process died);
- disaggregation (``Handoff``): vLLM's NIXL connector. A prefill leg
  (``kv_transfer.do_remote_decode``) runs with vLLM's ``do_remote_decode`` and one output token;
  vLLM's ``kv_transfer_params`` come back msgpacked in ``KVTransferParams.engine_params``, which
  the router passes unchanged to a decode worker announcing the same ``kv_connector``. There
  vLLM pulls the blocks it lacks (its own prefix hits are kept) and, when the pull fails,
  computes the prompt itself (``kv_load_failure_policy: recompute``; counted). Each set of
  params is used once (the router sends one decode leg per prefill), within the prefill
  side's lease (``kv_lease_duration`` = the worker's KV transfer timeout), which the decode
  side extends while it holds the request: a pull after the lease reads reused blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from interlock import scratch, shm
from interlock.engine.config import EngineConfig
from interlock.engine.serving import FixedSizes, KVEventSink, NullKVEventSink
from interlock.engine.vllm.args import vllm_engine_args
from interlock.engine.vllm.events import Translator
from interlock.engine.vllm.sampling import sampling_kwargs
from interlock.engine.vllm.sleep import Sleeper
from interlock.engine.vllm.subscriber import EventSubscriber
from interlock.errors import ConfigError, EngineError, InterlockError, InvalidRequest, ServiceUnavailable
from interlock.protocol import (
    ErrorInfo,
    GenerateOutput,
    GenerateRequest,
    KVEvent,
    KVTransferParams,
    LoadReport,
    SamplingParams,
    TokenLogprobs,
)
from interlock.protocol.kv_sync import stored_by_tier

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "vLLM is not installed in this environment: on a CPU machine `./scripts/setup.sh --vllm` "
    "(vLLM's CPU build), on a GPU machine `pip install vllm` (docs/vllm.md)"
)
_EMA = 0.2
"""Weight of the newest sample in the measured prefill speed and decode step time."""


KV_CONNECTOR = "vllm-nixl"
"""What a vLLM worker with the NIXL connector announces (``metadata["kv_connector"]``)."""
_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder(dict[str, Any]).decode


@dataclass(frozen=True)
class Handoff:
    """vLLM's NIXL connector for a worker that takes part in disaggregation."""

    host: str = "127.0.0.1"
    """Where other workers reach this one's NIXL side channel."""
    lease_s: float = 30.0
    """How long a prefill's blocks wait for their decode worker (``kv_lease_duration``)."""
    transport: str = "auto"
    """``tcp`` forces UCX onto TCP (``UCX_TLS``); ``auto`` and ``shm`` let UCX choose."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _connector_config(handoff: Handoff, instance_id: str, device: str) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config``; sets the side channel's environment (read by vLLM)."""
    if importlib.util.find_spec("nixl") is None:
        raise ConfigError(
            "vLLM's NIXL connector needs nixl: `pip install nixl==1.5.1` (setup.sh --vllm installs it)"
        )
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = handoff.host
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(_free_port(handoff.host))
    if handoff.transport == "tcp":
        os.environ["UCX_TLS"] = "tcp"
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",  # a worker's role can change while it runs
        "kv_buffer_device": "cpu" if device == "cpu" else "cuda",
        # Handshakes are cached by engine id: a restarted worker must not reuse its old one.
        "engine_id": f"{instance_id or 'vllm'}-{uuid.uuid4().hex[:8]}",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"kv_lease_duration": handoff.lease_s},
    }


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
        ranks = config.model.ranks
        allowed = sorted(os.sched_getaffinity(0))
        if threads and threads < cores:
            # Several workers share this host's cores: no pinning (each would pin the same
            # cores), each computing on its share.
            defaults["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            defaults["OMP_NUM_THREADS"] = str(threads)
        elif 1 < ranks <= len(allowed):
            # vLLM's CPU ranks each bind their own cores; on one NUMA node it cannot split
            # them itself, so each rank gets its run of this worker's cores ("0|1").
            share = len(allowed) // ranks
            runs = [allowed[r * share : (r + 1) * share] for r in range(ranks)]
            defaults["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, run)) for run in runs)
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def _release_segments(names: set[str]) -> None:
    """Unlink vLLM's shared-memory segments that only its own (dying) processes map: a dead
    core's executor outlives it a moment, its parent gone but still in this process group; no
    one else attaches these by name."""
    dying = {*_this_process_tree(), *shm.group_members(os.getpgrp())}
    if gone := shm.release(names, exclude=dying):
        log.info("unlinked %d shared-memory segments vLLM left", len(gone))


def _this_process_tree() -> list[int]:
    """This process and those below it (vLLM's engine core and its executor's workers)."""
    return [os.getpid(), *shm.descendants(os.getpid())]


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
    info = ErrorInfo(code=err.code, message=err.message, status=err.status, param=err.param)
    return GenerateOutput(request_id=rid, finish_reason="error", error=info)


class VllmEngine(FixedSizes):
    name = "vllm"

    def __init__(
        self,
        llm: Any,
        config: EngineConfig,
        workdir: str,
        endpoints: tuple[str, str],
        handoff: Handoff | None = None,
    ) -> None:
        self._llm = llm
        self._handoff = handoff
        self._counts = {"nixl_prefills": 0, "nixl_pulls": 0, "nixl_failed": 0}
        self._config = config
        self._workdir = workdir
        self._endpoints = endpoints
        cache = llm.vllm_config.cache_config
        super().__init__(
            int(cache.block_size),
            int(cache.num_gpu_blocks or 0),
            int(llm.vllm_config.model_config.max_model_len),
        )
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
        after = config.model.offload_after_s
        self._sleeper = Sleeper(llm, after, self._slept_or_woke) if after else None
        """vLLM's sleep mode for an idle model (``offload_after_s``; CUDA only)."""
        self._sleep_task: asyncio.Task[None] | None = None
        self._load = self._report(0, 0, 0.0, 0.0, 0)
        self._segments: set[str] = set()
        """vLLM's shared-memory segments (its engine core's message queues; not those of
        another engine colocated here): unlinked at shutdown, as a dead core leaves them."""

    # ---- construction ----
    @classmethod
    async def create(
        cls, config: EngineConfig, *, instance_id: str = "", handoff: Handoff | None = None
    ) -> VllmEngine:
        """Start vLLM for ``config`` (tens of seconds; minutes when it compiles); with
        ``handoff``, its NIXL connector for disaggregation."""
        _guest_environment(config)
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(f"{INSTALL_HINT} ({exc})") from exc
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        kwargs = vllm_engine_args(config, known)
        workdir = str(scratch.engine_dir(instance_id or "engine"))  # vLLM's sockets beside it
        endpoints = (f"ipc://{workdir}/kv-events", f"ipc://{workdir}/kv-replay")
        kwargs["kv_events_config"] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoints[0],
            "replay_endpoint": endpoints[1],
            "topic": "kv",
        }
        if handoff is not None:
            kwargs["kv_transfer_config"] = _connector_config(handoff, instance_id, config.model.device)
        holder: list[VllmEngine] = []
        started = time.monotonic()
        segments_before, t0 = shm.listing(), time.time()
        try:
            args = AsyncEngineArgs(**kwargs)
            llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(holder)])
        except BaseException as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            _release_segments(shm.created_since(segments_before, t0))  # a core that died starting
            if isinstance(exc, (ValueError, TypeError)):
                raise ConfigError(f"vLLM refused its engine arguments: {exc}") from exc
            raise
        engine = cls(llm, config, workdir, endpoints, handoff)
        holder.append(engine)
        engine._segments = shm.created_since(segments_before, t0)
        try:
            await engine._warm_up()
        except BaseException:
            with contextlib.suppress(Exception):
                await engine.shutdown()
            raise
        # vLLM's own: made while it started and mapped by its processes (not another engine's).
        engine._segments = shm.created_since(segments_before, t0) & shm.mapped_by(_this_process_tree())
        log.info(
            "vLLM engine ready in %.1fs: block size %d, %d KV blocks, context %d",
            time.monotonic() - started,
            engine.block_size,
            engine.kv_blocks_total,
            engine.context_length,
        )
        return engine

    async def _warm_up(self) -> None:
        """Two requests before serving: vLLM's first steps pay one-time costs, and the second
        gives the first load report this engine's measured prefill speed and decode step, so
        the router's cost model never prices a vLLM worker with Interlock's figures. Their
        blocks are dropped from vLLM's cache (the router is told with ``AllBlocksCleared``)."""
        n = max(1, min(self._block_size * 8, self._context_length - 8))
        for i in range(2):
            tokens = tuple(100 + (j * 7 + i) % 900 for j in range(n))
            params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
            req = GenerateRequest(request_id=f"interlock-warm-up-{i}", token_ids=tokens, sampling=params)
            t0, arrivals = time.perf_counter(), list[float]()
            async for out in self.generate(req):
                if out.error is not None:
                    raise EngineError(f"vLLM failed its warm-up request: {out.error.message}")
                arrivals += [time.perf_counter()] * len(out.token_ids)
        if arrivals:
            self._prefill_tps = n / max(arrivals[0] - t0, 1e-6)
            if len(arrivals) > 1:
                self._decode_step_s = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        self._pending_prefill.clear()
        await self._llm.reset_prefix_cache()
        self._load = self._report(0, 0, 0.0, 0.0, 0)

    # ---- the seam ----
    def start(self, sink: KVEventSink) -> None:
        self._sink = sink
        if self._events_task is None:
            subscriber = EventSubscriber(*self._endpoints, self._translator, self._publish)
            self._events_task = asyncio.create_task(subscriber.run(), name="vllm-kv-events")
        if self._sleeper is not None and self._sleep_task is None:
            self._sleep_task = asyncio.create_task(self._sleeper.run(), name="vllm-sleep")

    def _slept_or_woke(self) -> None:
        """The weights left or came back: the router hears it at once."""
        s = self._load
        self._load = self._report(s.num_running, s.num_waiting, 0.0, s.kv_blocks_used, 0)
        self._sink.on_load(self._load)

    def announce(self) -> dict[str, str]:
        if self._handoff is None:
            return {}
        return {"kv_connector": KV_CONNECTOR, "kv_block_nbytes": str(self._block_nbytes())}

    def handoff_counts(self) -> dict[str, int]:
        return dict(self._counts) if self._handoff is not None else {}

    def _block_nbytes(self) -> int:
        """Bytes of one KV block (all layers, K and V): what a hand-off moves per block."""
        mc = self._llm.vllm_config.model_config
        pc = self._llm.vllm_config.parallel_config
        per_token = 2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size()
        return int(per_token * self._block_size * mc.dtype.itemsize)

    def problem(self) -> str | None:
        if self._llm.errored:
            return "vLLM's engine core is dead"
        return None

    def load(self) -> LoadReport:
        return self._load

    async def kv_snapshot(self) -> list[KVEvent]:
        return self._translator.snapshot()

    async def kv_state(self) -> dict[str, list[int]]:
        return stored_by_tier(self._translator.snapshot())

    async def pool_status(self) -> tuple[int, int, str]:
        return self._load.kv_blocks_used, self._num_blocks, ""

    async def load_weights(self) -> float:
        return await self._sleeper.wake() if self._sleeper is not None else 0.0

    async def shutdown(self) -> None:
        if self._sleep_task is not None:
            self._sleep_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sleep_task
            self._sleep_task = None
        if self._events_task is not None:
            self._events_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._events_task
            self._events_task = None
        try:
            await asyncio.to_thread(self._llm.shutdown)
        finally:
            shutil.rmtree(self._workdir, ignore_errors=True)
            _release_segments(self._segments)

    async def generate(self, req: GenerateRequest) -> AsyncGenerator[GenerateOutput, None]:
        rid = req.request_id
        try:
            prompt, params, handing_off = self._vllm_request(req)
        except InterlockError as exc:
            yield _error(rid, exc)
            return
        n_prompt = len(req.token_ids)
        # What this prompt adds to the worker's prefill backlog: the part vLLM's cache lacks.
        self._pending_prefill[rid] = max(1, n_prompt - self._translator.cached_tokens(req.token_ids))
        try:
            async with contextlib.AsyncExitStack() as awake:
                if self._sleeper is not None:  # woken first if it sleeps; counted busy throughout
                    await awake.enter_async_context(self._sleeper.serving())
                stream = self._llm.generate(
                    prompt, params, rid, priority=req.priority if self._priority else 0
                )
                await awake.enter_async_context(contextlib.aclosing(stream))
                async for out in stream:
                    self._pending_prefill.pop(rid, None)
                    output = self._output(rid, out, n_prompt, params.prompt_logprobs)
                    if handing_off and out.finished:
                        output = self._handed_off(output, out)
                    yield output
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error output
            log.warning("vLLM request %s failed: %s", rid, exc)
            yield _error(rid, exc)
        finally:
            self._pending_prefill.pop(rid, None)

    # ---- translation ----
    def _vllm_request(self, req: GenerateRequest) -> tuple[Any, Any, bool]:
        """vLLM's prompt and sampling params, and whether this is a prefill handing off."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        s = req.sampling
        done = len(req.resume_token_ids)
        if done >= s.max_tokens:
            raise InvalidRequest("resume_token_ids already reach max_tokens", param="max_tokens")
        if req.needs_local_prefill and req.kv_transfer is not None and req.kv_transfer.do_remote_prefill:
            raise InvalidRequest(
                "prompt_logprobs needs the prompt computed here, not its KV from another worker",
                param="prompt_logprobs",
            )
        hand = self._transfer_params(req)
        prefill_only = hand is not None and bool(hand.get("do_remote_decode"))  # vLLM edits the dict
        kwargs = sampling_kwargs(s, done=done, prefill_only=prefill_only)
        structured = kwargs.pop("structured_outputs")
        params = VllmSamplingParams(
            **kwargs,
            structured_outputs=StructuredOutputsParams(**structured) if structured is not None else None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args={"kv_transfer_params": hand} if hand is not None else None,
        )
        return TokensPrompt(prompt_token_ids=[*req.token_ids, *req.resume_token_ids]), params, prefill_only

    def _transfer_params(self, req: GenerateRequest) -> dict[str, Any] | None:
        """vLLM's ``kv_transfer_params`` for this leg, or None (computed here as usual)."""
        kt = req.kv_transfer
        if kt is None:
            return None
        if self._handoff is None:
            raise ServiceUnavailable("this vLLM worker has no KV connector (its role is both)")
        if kt.do_remote_decode:
            if req.sampling.max_tokens - len(req.resume_token_ids) <= 1:
                return None  # finished at its first token: nothing to hand over
            self._counts["nixl_prefills"] += 1
            return {"do_remote_decode": True}
        if kt.do_remote_prefill and kt.engine_params:
            self._counts["nixl_pulls"] += 1
            return _unpack(kt.engine_params)
        return None  # no params (the prefill side could not hand over): compute the prompt

    def _handed_off(self, output: GenerateOutput, out: Any) -> GenerateOutput:
        """The prefill leg's last output, with vLLM's params for the decode worker. None from
        vLLM (a prompt shorter than a block: nothing to move) still hands over, with empty
        params: the decode worker computes the prompt. A request that ended at its first token
        (EOS) is simply finished."""
        if output.finish_reason == "stop":
            return output
        params = getattr(out, "kv_transfer_params", None)
        first = output.token_ids[0] if output.token_ids else None
        kt = KVTransferParams(
            do_remote_decode=True, first_token_id=first, engine_params=_pack(params) if params else b""
        )
        return msgspec.structs.replace(output, kv_transfer=kt)

    def _output(self, rid: str, out: Any, n_prompt: int, top_n: int | None = None) -> GenerateOutput:
        """``top_n``: the request's ``prompt_logprobs`` (None: it asked for none)."""
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
            prompt_logprobs=prompt_logprobs(out.prompt_token_ids, out.prompt_logprobs, top_n)
            if top_n is not None and out.prompt_logprobs
            else None,
        )

    # ---- KV events ----
    def _publish(self, events: list[KVEvent]) -> None:
        if events:
            self._sink.on_kv_events(events)

    # ---- load ----
    def _on_stats(self, scheduler: Any, iteration: Any) -> None:
        now = time.monotonic()
        tokens, prompt = 0, 0
        if iteration is not None:
            # Prompt tokens computed (not those read from the cache): the prefill work done.
            stats = getattr(iteration, "prompt_token_stats", None)
            prompt = int(stats.computed) if stats is not None else int(iteration.num_prompt_tokens)
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
        if scheduler.kv_connector_stats:
            self._counts["nixl_failed"] += _failed_transfers(scheduler.kv_connector_stats)
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
            kv_handoffs=tuple(self.handoff_counts().items()),
            weights_load_s=self._sleeper.weights_load_s if self._sleeper is not None else 0.0,
        )


def _failed_transfers(stats: Any) -> int:
    """Failed pulls and handshakes in one record of vLLM's connector stats (nested dicts of
    lists, one entry per event); each made the decode side compute the prompt itself."""
    if isinstance(stats, dict):
        n = 0
        for key, value in stats.items():
            if key in ("num_failed_transfers", "num_failed_handshakes") and isinstance(value, list):
                n += len(value)
            else:
                n += _failed_transfers(value)
        return n
    return _failed_transfers(getattr(stats, "data", None)) if hasattr(stats, "data") else 0


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


def prompt_logprobs(prompt: Sequence[int], entries: Sequence[Any], top_n: int) -> tuple[TokenLogprobs, ...]:
    """vLLM's ``RequestOutput.prompt_logprobs`` as ours: its list has None for the first prompt
    token, then per position a dict token id -> ``Logprob`` (``logprob``, ``rank``) holding the
    prompt token and the ``top_n`` best (one entry fewer when the prompt token is among them).
    Each becomes (the prompt token's logprob, the ``top_n`` best by logprob, ties by rank)."""
    out = []
    for tok, entry in zip(prompt[1:], entries[1:], strict=False):
        chosen = entry.get(tok)
        best = sorted(entry.items(), key=lambda kv: (-kv[1].logprob, kv[1].rank or 0))[:top_n]
        top = tuple((int(tid), float(lp.logprob)) for tid, lp in best)
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
