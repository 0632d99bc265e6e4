"""The Python API: a deployment from Python, built by the same builder as ``interlock serve``.

    from interlock import Cluster
    with Cluster.local() as cluster:                     # or Cluster.connect("nats://host:4222")
        cluster.register_model("smollm2", "smollm2")
        instance = cluster.create_serving_instance(model="smollm2", min_replicas=1, max_replicas=4)
        print(instance.generate("The capital of France is", max_tokens=32))

``Cluster.local()`` starts a private nats-server; ``Cluster.connect(url)`` joins an existing
deployment (its secrets from ``INTERLOCK_CLUSTER_SECRET`` / ``INTERLOCK_NATS_*`` unless given).
Either way this process runs a router, and the workers a serving instance starts are real
worker processes (supervised, restarted when they fail). Every call has an ``async`` twin
(``agenerate``, ``achat``, ``astream``, ...); sampling parameters are the OpenAI ones
(``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ...), refused by name
when unknown, exactly as the HTTP frontend refuses them.

``create_serving_instance(..., planner="reactive")`` (or ``"sla"``, a mapping of the
deployment file's ``planner:`` keys, a ``PlannerConfig``) sizes the instance with a planner
within ``min_replicas..max_replicas``, as ``interlock serve --planner`` sizes its fleet;
``instance.planner_status()`` lists its decisions with their reasons (and with
``planner_port=`` it serves them over HTTP too, ``GET instance.planner_url + "/planner"``, as
``interlock planner status`` reads them); it stops with the instance or the cluster.

The deployment runs on its own event loop in a background thread, so the blocking calls work
anywhere and the async ones from any loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec

from interlock.cluster.builder import RunningCluster, RunningPlanner, WorkerHandle
from interlock.cluster.spec import ClusterSpec, group_planner_config
from interlock.deploy import (
    ControlPlane,
    Deployment,
    ExecutionGroup,
    NodeGroup,
    Routing,
    node_group,
    validate_deployment,
)
from interlock.errors import ConfigError, InvalidRequest
from interlock.frontend.config import FrontendConfig
from interlock.names import ROLES
from interlock.planner.build import build_planner
from interlock.planner.config import PlannerConfig, RoleBounds, parse_planner_config
from interlock.planner.core import Planner
from interlock.runtime.config import NatsAuth

T = TypeVar("T")
P = ParamSpec("P")
_DONE = object()


def blocking(
    method: Callable[Concatenate[Cluster, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Cluster, P], T]:
    """The blocking twin of an async method of ``Cluster``, from its one signature: it runs the
    method on the cluster's loop and waits (the pattern of every twin here: one definition, the
    other derived)."""

    @functools.wraps(method)
    def run(self: Cluster, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(method(self, *args, **kwargs))

    run.__name__ = method.__name__.removeprefix("a")
    run.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.{run.__name__}"
    return run


class Cluster:
    """A deployment driven from Python; close it (or use ``with``) to stop what it started."""

    def __init__(self, spec: ClusterSpec) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="interlock-cluster", daemon=True)
        self._thread.start()
        self._running = RunningCluster(spec)
        self._models: dict[str, ExecutionGroup] = {}
        self._instances: list[ServingInstance] = []
        self._closed = False
        try:
            self._call(self._running.start())
        except BaseException:
            self._stop_loop()
            raise

    # ---- construction ----
    @classmethod
    def local(
        cls,
        *,
        http_port: int | None = None,
        heartbeat_interval: float = 1.0,
        migration_limit: int = Routing.migration_limit,
        stall_timeout_s: float = Routing.stall_timeout_s,
    ) -> Cluster:
        """Everything on this machine: a private nats-server and a router here; workers start
        as processes with ``create_serving_instance``. ``http_port``: also serve the OpenAI
        HTTP API on 127.0.0.1 (0: any free port, see ``http_url``). ``migration_limit`` and
        ``stall_timeout_s``: the router's, as the deployment file's ``routing:`` keys."""
        routing = Routing(migration_limit=migration_limit, stall_timeout_s=stall_timeout_s)
        return cls(_spec(None, http_port, heartbeat_interval, None, NatsAuth(), routing))

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        cluster_secret: bytes | None = None,
        nats_auth: NatsAuth | None = None,
        http_port: int | None = None,
        heartbeat_interval: float = 1.0,
        migration_limit: int = Routing.migration_limit,
        stall_timeout_s: float = Routing.stall_timeout_s,
    ) -> Cluster:
        """Join the deployment whose NATS server is ``url``: a router here sees its workers,
        and serving instances add worker processes to it (the other keywords: as ``local``)."""
        from interlock.env import get_env

        env = get_env()
        auth = nats_auth or NatsAuth(user=env.nats_user, password=env.nats_password, token=env.nats_token)
        secret = cluster_secret if cluster_secret is not None else env.cluster_secret
        routing = Routing(migration_limit=migration_limit, stall_timeout_s=stall_timeout_s)
        return cls(_spec(url, http_port, heartbeat_interval, secret, auth, routing))

    # ---- models and instances ----
    def register_model(
        self,
        name: str,
        path: str,
        *,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        **engine: Any,
    ) -> None:
        """Make ``path`` (a model folder, a GGUF file or a known name such as ``smollm2``)
        servable as ``name``. ``engine``: more ``ExecutionGroup`` fields (``runner``, ``dtype``,
        ``max_model_len``, ``block_size``, ``speedup``, ...); node fields (``max_num_seqs``,
        ``kv_cache_gib``, ``num_blocks``, ``host_kv_gib``, ``tier_load_timeout_s``, ...) go to
        ``create_serving_instance``."""
        known = {f for f in ExecutionGroup.__dataclass_fields__} - {
            "model",
            "served_model_name",
            "nodes",
            "max_replicas",
            "colocate",  # an instance's choice: create_serving_instance(colocate=...)
        }
        unknown = sorted(set(engine) - known)
        if unknown:
            raise ConfigError(
                f"register_model: unknown {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        if isinstance(engine.get("engine_args"), Mapping):  # vLLM's arguments, as a dict
            engine["engine_args"] = tuple(
                (str(k).replace("-", "_"), v) for k, v in engine["engine_args"].items()
            )
        group = ExecutionGroup(
            model=path,
            served_model_name=name,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            nodes=(NodeGroup(gpu_count=0),),
            **engine,
        )
        validate_deployment(Deployment(execution_groups=(group,)))
        self._models[name] = group

    async def acreate_serving_instance(
        self,
        model: str,
        *,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        role: str = "both",
        planner: PlannerSpec = None,
        planner_port: int | None = None,
        ready_timeout_s: float = 600.0,
        colocate: Sequence[str] | Mapping[str, Mapping[str, Any]] = (),
        **node: Any,
    ) -> ServingInstance:
        """Start ``min_replicas`` worker processes of ``model`` and wait until each serves
        (``ready_timeout_s``; a ``ConfigError`` names the worker that did not come up).
        ``max_replicas``: the most workers the instance may grow to (``scale_to`` and the
        planner stay within it; default ``min_replicas``). ``min_replicas=0`` starts no worker
        and needs a planner, which starts one when requests come (scale to zero). Workers
        start only while this host has room for them (``ClusterSpec.placement``). ``node``: ``NodeGroup`` fields, the
        deployment file's node keys (``max_num_seqs``, ``num_blocks``, ``host_kv_gib``,
        ``tier_load_timeout_s``, ...; its older names too), except the role and the count.

        ``planner``: a planner that adds and removes the instance's workers as its load asks,
        once they serve (None: the instance keeps its size; ``scale_to`` sizes it). A policy
        (``"reactive"``, or ``"sla"`` with a profile), a mapping with the keys of the deployment
        file's ``planner:`` section (``{"policy": "sla", "profile": "p.json", "ttft_ms": 500}``),
        or a ``PlannerConfig``. The bounds of the instance's role default to ``min_replicas``
        .. ``max_replicas`` (a ``PlannerConfig`` brings its own, capped by ``max_replicas``).
        Its decisions: ``planner_status()``; it stops when the instance or the cluster closes.
        ``planner_port``: also serve its status over HTTP (``GET /planner`` and ``/metrics``, on
        the control plane's listen host; 0: any free port) at ``instance.planner_url``.
        ``colocate``: other registered models each of its workers also hosts in its process,
        each with its own engine (names, or names mapped to their node keywords such as
        ``{"b": {"kv_cache_gib": 0.25}}``); ``instance.colocated(name)`` talks to one."""
        group = self._models.get(model)
        if group is None:
            raise ConfigError(
                f"model: {model!r} is not registered (registered: {', '.join(self._models) or 'none'})"
            )
        if min_replicas < 0:
            raise ConfigError("min_replicas: must be at least 0")
        if min_replicas == 0 and planner is None:
            raise ConfigError(
                "min_replicas: 0 starts no worker; give a planner (planner=...) to start them "
                "when requests come, or min_replicas of at least 1"
            )
        if planner_port is not None and planner is None:
            raise ConfigError(
                "planner_port: serves a planner's status; give create_serving_instance(planner=...)"
            )
        if planner_port is not None and not 0 <= planner_port < 65536:
            raise ConfigError(f"planner_port: {planner_port} is not a valid port")
        cap = min_replicas if max_replicas is None else max_replicas
        if cap < min_replicas:
            raise ConfigError(f"max_replicas: {cap} is below min_replicas {min_replicas}")
        hosted = colocate if isinstance(colocate, Mapping) else {name: {} for name in colocate}
        guests = []
        for name, keywords in hosted.items():
            guest = self._models.get(name)
            if guest is None or name == model:
                raise ConfigError(f"colocate: {name!r} is not another registered model")
            guests.append(replace(guest, nodes=(replace(instance_node("both", keywords), gpu_count=1),)))
        group = replace(group, nodes=(instance_node(role, node),), max_replicas=cap, colocate=tuple(guests))
        validate_deployment(Deployment(execution_groups=(group,)))
        planned = None
        if planner is not None:  # built (its profile read) before any worker starts
            policy = self._running.spec.deployment.routing.policy
            cfg = instance_planner_config(planner, group, policy, min_replicas)
            planned = await asyncio.to_thread(build_planner, cfg)
        instance = await self._on_loop(
            self._start_instance(model, group, min_replicas, ready_timeout_s, planned, planner_port)
        )
        self._instances.append(instance)
        return instance

    create_serving_instance = blocking(acreate_serving_instance)

    async def _start_instance(
        self,
        model: str,
        group: ExecutionGroup,
        replicas: int,
        timeout_s: float,
        planner: Planner | None,
        planner_port: int | None,
    ) -> ServingInstance:
        running = self._running
        index = await running.add_group(group)
        running.expect_group(index, on_demand=replicas == 0 and planner is not None)
        role = group.nodes[0].node_role
        instance = ServingInstance(self, model, index, group.max_replicas or replicas, role)
        try:
            await instance._resize(replicas, timeout_s)
        except ConfigError as e:
            with contextlib.suppress(ConfigError):  # none of its workers is left running
                await instance._resize(0, timeout_s)
            raise ConfigError(f"serving instance of {model!r} did not start: {e}") from None
        if planner is not None:
            instance._planner = await running.run_planner(
                planner, index, model=model, status_port=planner_port
            )
        return instance

    @property
    def http_url(self) -> str | None:
        """The OpenAI HTTP API's base URL (``.../v1``), when ``http_port`` was given."""
        server = self._running.server
        return f"{server.url}/v1" if server is not None else None

    @property
    def running(self) -> RunningCluster:
        """The builder's running deployment (``add_worker``, ``remove_worker``, ``workers``).
        Its coroutines run on this cluster's loop: use ``call``."""
        return self._running

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the cluster's loop and wait for it."""
        return self._call(coro)

    # ---- lifecycle ----
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._running.close())
        finally:
            self._stop_loop()

    async def aclose(self) -> None:
        if not self._closed:
            await self._on_loop(self._running.close())
            self._closed = True
            self._stop_loop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def _submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if self._closed and not self._loop.is_running():
            coro.close()
            raise ConfigError("the cluster is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` (run on the cluster's loop) from any loop, even the cluster's own."""
        try:
            if asyncio.get_running_loop() is self._loop:
                return await coro
        except RuntimeError:
            pass
        return await asyncio.wrap_future(self._submit(coro))


class ServingInstance:
    """The workers serving one registered model, and how to ask them for text."""

    def __init__(
        self, cluster: Cluster, model: str, group: int, max_replicas: int, role: str = "both"
    ) -> None:
        self.cluster = cluster
        self.model = model
        self.group = group
        self._constraints: Any = None  # the frontend's ConstraintCheck, made on first use
        """Its execution group in the cluster's builder (one per instance)."""
        self.max_replicas = max_replicas
        self.role = role
        self._planner: RunningPlanner | None = None
        self._host: str | None = None
        """For a model another instance's workers host (``colocated``): that model's name."""

    def colocated(self, name: str) -> ServingInstance:
        """The model ``name`` this instance's workers also host (``colocate``): ask it for text
        the same way; its workers are this instance's."""
        group = self.cluster._running.spec.deployment.execution_groups[self.group]
        if name not in {c.served_model_name for c in group.colocate}:
            raise ConfigError(f"colocated: {name!r} is not hosted by the workers of {self.model!r}")
        guest = ServingInstance(self.cluster, name, self.group, self.max_replicas, "both")
        guest._host = self.model
        return guest

    @property
    def workers(self) -> list[WorkerHandle]:
        """Its running workers (a worker the planner is draining is not listed)."""
        return [h for h in self.cluster._running.workers() if h.group == self.group]

    # ---- text ----
    def generate(self, prompt: str | Sequence[int], **sampling: Any) -> str:
        """The completion of ``prompt`` (text or token ids), as one string."""
        return self.cluster._call(self._text({"prompt": _prompt(prompt), **sampling}, "completions"))

    def chat(self, messages: Sequence[dict[str, Any]], **sampling: Any) -> str:
        """The assistant's reply to ``messages`` (``[{"role": "user", "content": "..."}]``)."""
        return self.cluster._call(self._text({"messages": list(messages), **sampling}, "chat"))

    async def agenerate(self, prompt: str | Sequence[int], **sampling: Any) -> str:
        return await self.cluster._on_loop(self._text({"prompt": _prompt(prompt), **sampling}, "completions"))

    async def achat(self, messages: Sequence[dict[str, Any]], **sampling: Any) -> str:
        return await self.cluster._on_loop(self._text({"messages": list(messages), **sampling}, "chat"))

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[dict[str, Any]] | None = None,
        **sampling: Any,
    ) -> Iterator[str]:
        """Text pieces as they are generated (a prompt, or chat ``messages``). Leaving the loop
        early aborts the request on its worker."""
        out: queue.Queue[object] = queue.Queue()
        future = self.cluster._submit(self._pump(self._body(prompt, messages, sampling), out.put))
        try:
            while (item := out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield str(item)
        finally:
            future.cancel()

    async def astream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[dict[str, Any]] | None = None,
        **sampling: Any,
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[object] = asyncio.Queue()
        body = self._body(prompt, messages, sampling)
        future = self.cluster._submit(
            self._pump(body, lambda x: loop.call_soon_threadsafe(out.put_nowait, x))
        )
        try:
            while (item := await out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield str(item)
        finally:
            future.cancel()

    # ---- replicas ----
    def scale_to(self, replicas: int, *, timeout_s: float = 600.0) -> None:
        """Start or stop (drained) workers until ``replicas`` serve; within ``max_replicas``.
        It returns once every new worker serves (registered with the router: a request may go
        to it) and every removed one has stopped and left the router; a worker that does not
        come up within ``timeout_s`` is named in a ``ConfigError`` (the others keep serving).
        An add this host has no room for is refused before any worker starts. Refused while
        a planner sizes the instance."""
        self._own_workers("scale_to")
        self.cluster._call(self._scale(replicas, timeout_s))

    async def ascale_to(self, replicas: int, *, timeout_s: float = 600.0) -> None:
        self._own_workers("scale_to")
        await self.cluster._on_loop(self._scale(replicas, timeout_s))

    def _own_workers(self, what: str) -> None:
        if self._host is not None:
            raise ConfigError(
                f"{what}: {self.model!r} lives in the workers of {self._host!r}; size or close that"
            )

    @property
    def planner_url(self) -> str | None:
        """Where its planner's status is served (``GET {planner_url}/planner``, ``/metrics``;
        None: no planner, or ``planner_port`` not given)."""
        return self._planner.url if self._planner is not None else None

    def planner_status(self) -> dict[str, Any]:
        """What ``interlock planner status`` lists: the policy, ticks, failed ticks
        (``errors``), what each pool wants and why it holds, ``decisions_total`` by kind
        (add, remove, switch) and every decision with its time, worker and reason."""
        return self.cluster._call(self._planner_status())

    async def aplanner_status(self) -> dict[str, Any]:
        return await self.cluster._on_loop(self._planner_status())

    def close(self) -> None:
        """Stop its planner, if any, then its workers (drained)."""
        self._own_workers("close")
        self.cluster._call(self._close())

    async def aclose(self) -> None:
        self._own_workers("close")
        await self.cluster._on_loop(self._close())

    async def _planner_status(self) -> dict[str, Any]:
        if self._planner is None:
            raise ConfigError(
                f"serving instance of {self.model!r} has no planner (create_serving_instance(planner=...))"
            )
        return self._planner.loop.status()  # type: ignore[no-any-return]

    async def _close(self) -> None:
        if self._planner is not None:
            planned, self._planner = self._planner, None
            await self.cluster._running.stop_planner(planned)
        await self._resize(0, 600.0)

    async def _scale(self, replicas: int, timeout_s: float) -> None:
        if self._planner is not None:
            raise ConfigError(
                f"scale_to: a planner sizes the serving instance of {self.model!r} "
                f"(within {self.max_replicas} max_replicas)"
            )
        if replicas > self.max_replicas:
            raise ConfigError(
                f"replicas: {replicas} is above this instance's max_replicas={self.max_replicas}"
            )
        await self._resize(replicas, timeout_s)

    async def _resize(self, replicas: int, timeout_s: float) -> None:
        """Add or remove (drained) workers to ``replicas``; return once the added serve and the
        removed have left the router (else a ``ConfigError`` naming the worker)."""
        running = self.cluster._running
        need = replicas - len(self.workers)
        if need > 0:
            room, binding = await running.room(self.group, self.role)
            if room < need:
                raise ConfigError(
                    f"replicas: {replicas} needs {need} more workers, this host has room for {room} ({binding})"
                )
        added = [await running.add_worker(self.role, self.group) for _ in range(max(need, 0))]
        removed = []
        while len(self.workers) > max(replicas, 0):
            removed.append(self.workers[-1].instance_id)
            await running.remove_worker(self.workers[-1], drain=True)
        why = await running.wait_serving(added, timeout_s) if added else None
        why = why or (await running.wait_gone(removed, timeout_s) if removed else None)
        if why is not None:
            raise ConfigError(f"scale to {replicas} workers of {self.model!r}: {why}")

    # ---- on the cluster's loop ----
    def _body(self, prompt: Any, messages: Any, sampling: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if (prompt is None) == (messages is None):
            raise ConfigError("give a prompt or messages (one of them)")
        if messages is not None:
            return {"messages": list(messages), **sampling}, "chat"
        return {"prompt": _prompt(prompt), **sampling}, "completions"

    async def _text(self, body: dict[str, Any], endpoint: str) -> str:
        return "".join([piece async for piece in self._pieces(body, endpoint)])

    async def _pump(self, request: tuple[dict[str, Any], str], put: Any) -> None:
        try:
            async for piece in self._pieces(*request):
                put(piece)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            put(e)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            put(_DONE)

    async def _pieces(self, body: dict[str, Any], endpoint: str) -> AsyncIterator[str]:
        from interlock.frontend.assembler import OutputAssembler
        from interlock.frontend.config import FrontendConfig
        from interlock.frontend.prepare import generate_request
        from interlock.frontend.schemas import parse_chat, parse_completion, stop_strings
        from interlock.protocol.routing import RequestContext

        service = self.cluster._running.service
        tokenizers = self.cluster._running.tokenizers
        if "stream" in body:
            raise ConfigError("stream: use stream() / astream()")
        raw = msgspec.json.encode({**body, "model": self.model})
        req = parse_chat(raw) if endpoint == "chat" else parse_completion(raw)
        _one_text(body)
        entry = next((m for m in service.models() if m.name == self.model), None)
        if entry is None:
            raise ConfigError(f"model {self.model!r} has no worker")
        service.prefetch(entry.name)  # idle weights load while the prompt is prepared
        tok = await tokenizers.tokenizer(entry)
        limits = self.cluster._running.spec.frontend or FrontendConfig()  # the HTTP API's limits
        rid = f"py-{uuid.uuid4().hex}"
        greq, ids = await generate_request(
            req,
            entry,
            tok,
            request_id=rid,
            priority=req.priority or 0,
            max_prompt_chars=limits.max_prompt_chars,
            max_prompt_tokens=limits.max_prompt_tokens,
        )
        if greq.sampling.structured is not None:  # a bad schema is refused here, as over HTTP
            from interlock.frontend.choices import ConstraintCheck

            self._constraints = self._constraints or ConstraintCheck()
            await self._constraints.check(tok, greq, req, None, None)
        ctx = RequestContext(request_id=rid, endpoint=endpoint, priority=req.priority or 0)
        assembler = OutputAssembler(
            tok,
            ids,
            stop=stop_strings(req),
            skip_special_tokens=req.skip_special_tokens,
            include_stop=req.include_stop_str_in_output,
        )
        stream = service.generate(greq, ctx)
        try:
            async for out in stream:
                delta = assembler.push(out)
                if delta.text:
                    yield delta.text
                if delta.finish_reason is not None:
                    return
        finally:
            await stream.aclose()


# Fields that shape a response body beyond its text: the Python API returns the text alone.
_HTTP_ONLY: dict[str, tuple[object, ...]] = {  # each with its neutral values
    "n": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None,),
    "echo": (None, False),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "return_tokens_as_token_ids": (None, False),
}


def _one_text(body: Mapping[str, Any]) -> None:
    for name, neutral in _HTTP_ONLY.items():
        value = body.get(name)
        if not any(value is v or (type(value) is type(v) and value == v) for v in neutral):
            raise InvalidRequest(
                f"{name} is not supported here: the Python API returns one text (use the HTTP API)",
                param=name,
            )


PlannerSpec = str | PlannerConfig | Mapping[str, Any] | None
"""What ``create_serving_instance(planner=...)`` takes: a policy name, the deployment file's
``planner:`` keys, or a ``PlannerConfig`` (None: no planner)."""


def instance_node(role: str, node: Mapping[str, Any]) -> NodeGroup:
    """The node group of a serving instance: ``create_serving_instance``'s ``node`` keywords, read
    as a deployment file reads a node group, with ``role``. It starts no worker itself (the
    instance adds them one by one), so its role and count are not keywords."""
    given = sorted({"node_role", "role", "gpu_count", "count"} & set(node))
    if given:
        raise ConfigError(
            f"create_serving_instance: {', '.join(given)}: give role= and min_replicas= instead"
        )
    return replace(node_group(node, "create_serving_instance"), node_role=role, gpu_count=0)


def instance_planner_config(
    planner: str | PlannerConfig | Mapping[str, Any],
    group: ExecutionGroup,
    routing_policy: str,
    replicas: int,
) -> PlannerConfig:
    """The planner of a serving instance of ``group`` that starts ``replicas`` workers: its
    role's bounds ``replicas .. max_replicas`` unless given; refused by name, before any
    worker starts, when unknown or when it could not scale the instance."""
    role = group.nodes[0].node_role
    cap = group.max_replicas or replicas
    if isinstance(planner, PlannerConfig):
        cfg = planner
    else:
        if isinstance(planner, str):
            raw: Mapping[str, Any] = {"policy": planner}
        elif isinstance(planner, Mapping):
            raw = planner
        else:
            raise ConfigError(
                f"planner: expected a policy name, a mapping or a PlannerConfig, got {type(planner).__name__}"
            )
        bounds: dict[str, Any] = {r: RoleBounds(replicas, cap) if r == role else RoleBounds() for r in ROLES}
        cfg = parse_planner_config(raw, base=PlannerConfig(**bounds))
    cfg = group_planner_config(cfg, group, routing_policy, {role})
    if cfg.total_max() <= replicas and cfg.bounds(role).min >= replicas:
        raise ConfigError(
            f"planner: nothing to scale: max_replicas={cap} and the planner keeps at least {replicas} "
            "workers (give max_replicas above min_replicas)"
        )
    return cfg


def _prompt(prompt: str | Sequence[int]) -> str | list[int]:
    return prompt if isinstance(prompt, str) else list(prompt)


def _spec(
    url: str | None,
    http_port: int | None,
    heartbeat_interval: float,
    secret: bytes | None,
    auth: NatsAuth,
    routing: Routing,
) -> ClusterSpec:
    cp = ControlPlane(nats_url=url, listen_port=http_port or 0, heartbeat_interval=heartbeat_interval)
    d = Deployment(control_plane=cp, routing=routing, execution_groups=())
    validate_deployment(d)
    return ClusterSpec(
        deployment=d,
        frontend=FrontendConfig() if http_port is not None else None,
        cluster_secret=secret,
        nats_auth=auth,
    )
