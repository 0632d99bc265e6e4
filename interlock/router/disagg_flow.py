"""The router's disaggregated path: decode worker, maybe a prefill worker, one client stream.

Per request (``DisaggFlow.prepare``):
  1. route to a decode worker (role "decode" or "both"), and tentatively to a prefill worker
     (role "prefill"; the ``kv`` policy prefers the one holding the prefix) if one is free now:
     with the prefill pool busy the decode worker prefills itself. With ``enforce`` the prefill
     leg is routed first and waits in the router's queue for a prefill worker like any request
     (see ``_place_enforced``), then the decode worker is chosen;
  2. ``disagg.choose`` decides remote or local from the workers' last load reports, the KV
     index's overlaps and the link's last check; the reason is logged and counted;
  3. remote: the prefill worker computes the prompt and the first token, stages the KV and
     answers with a descriptor. The client gets that first token at once. The decode worker
     then gets the request with ``do_remote_prefill`` + descriptor, pulls the KV into blocks
     it allocated, and streams the rest. Its first chunk repeats the first token (the engine
     counts it as its first output), so that token is dropped here: never a duplicate;
  4. a prefill that fails (worker died, error, no descriptor) falls back to a local prefill
     on the decode worker. The decode leg belongs to the dispatcher (``router.dispatcher``),
     like any other leg: a decode worker that fails is replaced, and one that dies mid-stream
     is migrated, the first token included.

``prepare`` runs steps 1–3 up to the hand-over and returns the first token (if the prefill
worker produced it) and the decode ``Leg``. A request that wants prompt logprobs skips them,
``enforce`` or not: a decode worker computes its prompt, since a KV hand-off carries no logits
(``GenerateRequest.needs_local_prefill``; counted with reason ``prompt_logprobs``).

Link checks: a background loop asks each decode worker (control call ``measure_link``) to
measure its link to each prefill worker's transfer agent, when a pair first appears and every
``link_check_interval_s`` after; a failed check keeps requests off that pair until a later
check passes: the prefill goes to another free prefill worker whose link passed (``_relink``),
else it is local (refused under ``enforce``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace

import msgspec

from interlock.errors import NoWorkers, ServiceError, ServiceUnavailable, TransportError
from interlock.metrics import Registry
from interlock.protocol import GenerateOutput, GenerateRequest, InstanceInfo, KVTransferParams
from interlock.protocol.control import ControlReply, ControlRequest
from interlock.router.admission import Pending, RequestMeta
from interlock.router.decision import Decision
from interlock.router.directory import Leg, WorkerDirectory
from interlock.router.disagg import (
    STAY_REASONS,
    DisaggChoice,
    DisaggConfig,
    LinkEstimate,
    WorkerEstimate,
    choose,
)
from interlock.router.dispatcher import Dispatcher
from interlock.router.model_router import Router
from interlock.router.worker_control import control_call

log = logging.getLogger(__name__)


PREFILL_SUFFIX = "#prefill"
"""Router-side id of a request's prefill leg (its load is tracked apart from the decode's)."""


NO_PREFILL_WAIT_S = 5.0
"""Enforced disaggregation with no prefill worker alive: how long a request waits for one to
come back (a restart) before its 503."""


class DisaggFlow:
    def __init__(self, directory: WorkerDirectory, dispatcher: Dispatcher, config: DisaggConfig) -> None:
        self.svc = directory
        self.dispatcher = dispatcher
        self.config = config
        self.links: dict[tuple[str, str], tuple[LinkEstimate, float]] = {}
        """(prefill id, decode id) -> (last check, when)."""
        self.choices: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        """Remote prefills that ended local anyway, by cause."""
        self.pending: dict[str, int] = {}
        """Worker id -> prompt tokens this router sent there whose prefill has not ended: load
        reports lag by a step (seconds on a CPU), so a burst would otherwise all look idle."""

    # ---- which path ----
    def active(self, router: Router, request: GenerateRequest) -> bool:
        """This request takes the disaggregated path: its model has prefill workers."""
        if request.kv_transfer is not None or not self.config.enabled:
            return False
        return self.config.enforce or self.svc.has_prefill(router)

    # ---- per request ----
    async def prepare(
        self, router: Router, request: GenerateRequest, meta: RequestMeta, hashes: list[int]
    ) -> tuple[GenerateOutput | None, Leg | None]:
        """Place the prefill and run it if remote: (first output or None, decode leg or None
        when the request already finished at its first token)."""
        rid = request.request_id
        dispatcher = self.dispatcher
        hashes = await self.svc.looked_up(router, hashes)  # once for every leg and probe
        if request.needs_local_prefill:
            return None, await self._required_local(router, request, meta, hashes)
        if self.config.enforce:
            d, p = await self._place_enforced(router, request.model, meta, hashes)
        else:
            d, p = await dispatcher.route(router, replace(meta, role="decode"), hashes), None
        try:
            if not self.config.enforce:
                p = self._tentative_prefill(router, meta, hashes, d.worker_id)
            if p is not None:
                p = await self._relink(router, meta, hashes, p, d.worker_id)
            choice = self._choose(request, d, p)
            self._count(self.choices, choice.reason)
            log.info(choice.log_line(rid))
            computes = p if choice.remote and p is not None else d
            router.metrics.record_request(meta.prompt_tokens, computes.cached_tokens)
            if not choice.remote:
                if p is not None:
                    dispatcher.finish(router, p.request_id)
                if self.config.enforce and choice.reason in STAY_REASONS:
                    raise NoWorkers(f"disaggregation enforced but {choice.reason}", retry_after=1.0)
                return None, self._local(d, request)
            assert p is not None
            final = await self._prefill(router, request, p)
        except BaseException:
            dispatcher.finish(router, rid)
            if p is not None:  # not started, or its leg already finished it: then a no-op
                dispatcher.finish(router, p.request_id)
            raise
        if final is None or final.kv_transfer is None and final.error is not None:
            self._count(self.fallbacks, "prefill_failed")
            return None, self._local(d, request)
        if final.kv_transfer is None:  # finished at its first token (EOS or max_tokens 1)
            dispatcher.finish(router, rid)
            return final, None
        if final.kv_transfer.descriptor is None and not final.kv_transfer.engine_params:
            self._count(self.fallbacks, "not_staged")
        kt = msgspec.structs.replace(final.kv_transfer, do_remote_decode=False, do_remote_prefill=True)
        decode_req = msgspec.structs.replace(request, kv_transfer=kt)
        first = msgspec.structs.replace(final, finish_reason=None, kv_transfer=None)
        return first, Leg(d, decode_req, skip_first=True)

    async def _required_local(
        self, router: Router, request: GenerateRequest, meta: RequestMeta, hashes: list[int]
    ) -> Leg:
        """A request whose prompt must be computed where it decodes (prompt logprobs: a KV
        hand-off carries no logits) goes to a decode worker, ``enforce`` or not."""
        d = await self.dispatcher.route(router, replace(meta, role="decode"), hashes)
        self._count(self.choices, "prompt_logprobs")
        log.info("prefill %s local (prompt_logprobs)", request.request_id)
        router.metrics.record_request(meta.prompt_tokens, 0)  # it takes no prefix hit
        return self._local(d, request)

    def _local(self, d: Decision, request: GenerateRequest) -> Leg:
        """The decode worker prefills itself; its prompt tokens count as pending there."""
        return Leg(d, request, held_tokens=self.hold(d.worker_id, len(request.token_ids) - d.cached_tokens))

    async def _place_enforced(
        self, router: Router, model: str, meta: RequestMeta, hashes: list[int]
    ) -> tuple[Decision, Decision | None]:
        """(decode worker, prefill worker or None) for a request that must prefill remotely.

        The prefill leg is routed first and, with every prefill worker busy, waits in the
        router's queue like any request (priority, ``Overloaded`` when the queue is full,
        ``queue_timeout_s``, cancellation). Only then is the decode worker chosen: it has
        nothing to do until the prefill answers, and a decode worker chosen first would carry
        this request's slot and KV footprint through the whole wait, so a prefill-bound
        burst would make idle decode workers look busy to everyone else. Every request takes
        the legs in the same order, and the router's queue passes over a role whose workers
        are all busy (``Router.dispatch_queued``), so a decode leg holding a prefill worker
        never waits behind prefill legs waiting for it. With no prefill worker alive at all (the
        pool restarting: about a second under ``serve``), the request waits up to
        ``NO_PREFILL_WAIT_S`` for one rather than failing at once."""
        dispatcher = self.dispatcher
        pmeta = self._prefill_meta(meta)
        try:
            try:
                p = await dispatcher.route(router, pmeta, hashes)
            except NoWorkers:
                if router.has_eligible("prefill"):
                    raise  # alive but none free within the queue timeout
                wait_s = min(NO_PREFILL_WAIT_S, dispatcher.options.queue_timeout_s)
                ready = await self.svc.router_when_ready(model, wait_s, role="prefill")
                if ready is not router:
                    raise
                p = await dispatcher.route(router, pmeta, hashes)
        except NoWorkers as exc:
            self._count(self.choices, "no_prefill_worker")
            raise NoWorkers(
                f"disaggregation enforced but no_prefill_worker: {exc.message}", retry_after=exc.retry_after
            ) from None
        try:
            d = await dispatcher.route(router, replace(meta, role="decode"), hashes)
        except BaseException:
            dispatcher.finish(router, pmeta.request_id)
            raise
        if not self._usable_prefill(p.worker_id, d.worker_id):
            dispatcher.finish(router, pmeta.request_id)
            return d, None
        return d, p

    def _tentative_prefill(
        self, router: Router, meta: RequestMeta, hashes: list[int], decode_id: str
    ) -> Decision | None:
        """A prefill worker free now, or None: with a busy prefill pool the decode worker
        prefills itself (the per-request choice; only ``enforce`` waits for one)."""
        pmeta = self._prefill_meta(meta)
        try:
            p = router.route(pmeta, block_hashes=hashes, may_wait=False)
        except ServiceUnavailable:
            return None
        if isinstance(p, Pending) or not self._usable_prefill(p.worker_id, decode_id):
            self.dispatcher.finish(router, pmeta.request_id)
            return None
        return p

    async def _relink(
        self, router: Router, meta: RequestMeta, hashes: list[int], p: Decision, decode_id: str
    ) -> Decision:
        """``p``, or, when its link to the decode worker failed its last check, the next of its
        candidates (the ``kv`` policy ranks the free ones) whose link did not: the request goes
        remote there instead of ``link_failed`` (local, or a 503 under ``enforce``). Under
        ``enforce``, with no free candidate, any other live prefill worker with a sound link
        takes it though busy (a hung prefill worker's link fails its checks before its lease
        runs out: its requests must not become 503s meanwhile). Without ``enforce``, none free
        with a sound link is ``link_failed`` still, and the decode worker prefills itself."""
        if not self._link_failed(p.worker_id, decode_id):
            return p
        others = [c.worker_id for c in p.candidates]
        if self.config.enforce:
            others += [w for w in router.workers() if w not in others and self._is_prefill(w)]
        for w in others:
            if w == p.worker_id or not router.is_eligible(w) or self._link_failed(w, decode_id):
                continue
            if not self._usable_prefill(w, decode_id):
                continue
            router.cancel(p.request_id)  # not finish: its queue must not take w first
            pinned = replace(self._prefill_meta(meta), worker_id=w)
            q = await self.dispatcher.route(router, pinned, hashes)  # pinned: never queued
            log.info("link %s -> %s failed: %s prefills on %s", p.worker_id, decode_id, meta.request_id, w)
            self.dispatcher.dispatch_queued(router)  # p is free again
            return q
        return p

    def _is_prefill(self, worker_id: str) -> bool:
        info = self.svc.instance(worker_id)
        return info is not None and info.role in ("prefill", "both")

    def _link_failed(self, prefill_id: str, decode_id: str) -> bool:
        link = self.links.get((prefill_id, decode_id))
        return link is not None and not link[0].ok

    @staticmethod
    def _prefill_meta(meta: RequestMeta) -> RequestMeta:
        return replace(
            meta, request_id=meta.request_id + PREFILL_SUFFIX, role="prefill", session_id=None, worker_id=None
        )

    def _usable_prefill(self, worker_id: str, decode_id: str) -> bool:
        """Another worker than the decode one (a "both" worker can be either) that can hand
        its KV to it: an Interlock transfer agent, or the same guest-engine connector on both
        (``metadata["kv_connector"]``: vLLM's NIXL; a vLLM worker pulls from no other kind)."""
        if worker_id == decode_id:
            return False
        p, d = self.svc.instance(worker_id), self.svc.instance(decode_id)
        if p is None or d is None:
            return False
        connector = p.metadata.get("kv_connector")
        if connector is not None or d.metadata.get("kv_connector") is not None:
            return connector == d.metadata.get("kv_connector")
        return "kv_transfer_address" in p.metadata

    def _choose(self, request: GenerateRequest, d: Decision, p: Decision | None) -> DisaggChoice:
        info = self.svc.instance(d.worker_id)
        block_size = d.block_size
        blocks = math.ceil(len(request.token_ids) / block_size)
        nbytes = int(info.metadata.get("kv_block_nbytes", "0")) if info is not None else 0
        link = self.links.get((p.worker_id, d.worker_id)) if p is not None else None
        return choose(
            prompt_tokens=len(request.token_ids),
            kv_bytes=blocks * nbytes,
            blocks_needed=blocks,
            decode=self._estimate(d),
            prefill=self._estimate(p) if p is not None else None,
            link=link[0] if link is not None else None,
            config=self.config,
        )

    def hold(self, worker_id: str, tokens: int) -> int:
        tokens = max(tokens, 1)
        self.pending[worker_id] = self.pending.get(worker_id, 0) + tokens
        return tokens

    def release(self, worker_id: str, tokens: int) -> int:
        """Returns 0 (what is still held), so ``held = self.release(...)`` is idempotent."""
        if tokens:
            left = self.pending.get(worker_id, 0) - tokens
            if left > 0:
                self.pending[worker_id] = left
            else:
                self.pending.pop(worker_id, None)
        return 0

    def _estimate(self, d: Decision) -> WorkerEstimate:
        r = self.svc.report(d.worker_id)
        info = self.svc.instance(d.worker_id)
        pending = self.pending.get(d.worker_id, 0)
        if r is None:
            total = info.kv_blocks_total if info is not None else 0
            return WorkerEstimate(
                d.worker_id, queued_prefill_tokens=pending, cached_tokens=d.cached_tokens, free_blocks=total
            )
        return WorkerEstimate(
            d.worker_id,
            queued_prefill_tokens=max(r.queued_prefill_tokens, pending),
            prefill_tokens_per_s=r.prefill_tokens_per_s,
            cached_tokens=d.cached_tokens,
            free_blocks=r.kv_blocks_total - r.kv_blocks_used,
            num_running=r.num_running,
            decode_step_s=r.decode_step_s,
        )

    async def _prefill(self, router: Router, request: GenerateRequest, p: Decision) -> GenerateOutput | None:
        """The prefill leg's final output, or None when the prefill worker failed."""
        req = msgspec.structs.replace(request, kv_transfer=KVTransferParams(do_remote_decode=True))
        final: GenerateOutput | None = None
        uncached = self.hold(p.worker_id, len(request.token_ids) - p.cached_tokens)
        try:
            async for out in self.dispatcher.stream(router, p, req):
                if out.finished:
                    final = out
        except ServiceError as exc:  # gone, draining, engine fault: not the request's fault
            log.warning(
                "prefill worker %s failed (%s): prefilling %s locally",
                p.worker_id,
                exc.message,
                request.request_id,
            )
            if isinstance(exc, TransportError):
                router.set_health(p.worker_id, False)
        finally:
            self.release(p.worker_id, uncached)
        return final

    # ---- link checks ----
    async def link_loop(self, tick_s: float = 1.0) -> None:
        while True:
            for prefill, decode in self._pairs():
                key = (prefill.instance_id, decode.instance_id)
                last = self.links.get(key)
                if last is None or time.monotonic() - last[1] >= self.config.link_check_interval_s:
                    self.links[key] = (await self._check(prefill, decode), time.monotonic())
            await asyncio.sleep(tick_s)

    def _pairs(self) -> list[tuple[InstanceInfo, InstanceInfo]]:
        infos = self.svc.instances()
        return [
            (p, d)
            for p in infos
            if p.role == "prefill" and "kv_transfer_address" in p.metadata
            for d in infos
            if d.role != "prefill" and d.model == p.model and "control_address" in d.metadata
        ]

    async def _check(self, prefill: InstanceInfo, decode: InstanceInfo) -> LinkEstimate:
        req = ControlRequest(op="measure_link", peer_address=prefill.metadata["kv_transfer_address"])
        try:
            reply = await asyncio.wait_for(
                control_call(self.svc.requests, decode.metadata["control_address"], req), 30.0
            )
        except Exception as exc:  # noqa: BLE001 - a failed check is a result
            reply = ControlReply(ok=False, error=str(exc))
        if not reply.ok or reply.bandwidth_bytes_per_s <= 0:
            log.warning(
                "link %s -> %s failed its check: %s", prefill.instance_id, decode.instance_id, reply.error
            )
            self._count(self.fallbacks, "link_check_failed")
            return LinkEstimate(
                self.config.default_bandwidth_bytes_per_s, self.config.default_rtt_s, ok=False
            )
        log.info(
            "link %s -> %s: %.2f GB/s, rtt %.2f ms (%s)",
            prefill.instance_id,
            decode.instance_id,
            reply.bandwidth_bytes_per_s / 1e9,
            reply.rtt_s * 1e3,
            reply.transport,
        )
        return LinkEstimate(reply.bandwidth_bytes_per_s, reply.rtt_s)

    # ---- metrics ----
    @staticmethod
    def _count(table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def register_metrics(self, reg: Registry) -> None:
        """Placement choices and fallbacks, read at scrape time (docs/metrics.md)."""
        reg.collect(
            "interlock_disagg_choices_total", lambda: [((r,), n) for r, n in sorted(self.choices.items())]
        )
        reg.collect(
            "interlock_disagg_fallbacks_total", lambda: [((c,), n) for c, n in sorted(self.fallbacks.items())]
        )
