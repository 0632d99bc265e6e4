"""OpenTelemetry traces of one request (``interlock.metrics.tracing``): a request through an
in-process HTTP frontend, router and workers (mock engines on the real clock) makes one trace,
its spans linked frontend -> route / worker.generate -> engine / kv.transfer; with tracing off
nothing is recorded and OpenTelemetry is never imported."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import httpx
import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from interlock.cluster.runner import run_command
from interlock.engine.worker import Worker
from interlock.frontend.app import serve_frontend
from interlock.metrics import tracing
from interlock.protocol import GenerateRequest, SamplingParams
from interlock.protocol.generate import decode_request
from interlock.protocol.routing import RequestContext
from interlock.router.disagg import DisaggConfig
from interlock.router.model_router import RouterConfig
from interlock.router.service import RouterService
from interlock.runtime import InProcRegistry, connect_runtime
from interlock.transfer import TransferAgent
from tests.engine.conftest import timed_worker

MODEL = "m"
BLOCK = 4
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    tracing.configure(True, "test", exporter=exp)
    try:
        yield exp
    finally:
        tracing.configure(False)


@pytest.fixture(scope="module")
def smol_path() -> Path:
    from interlock.model_store import resolve_model

    return resolve_model("smollm2", progress=False)


@contextlib.asynccontextmanager
async def fleet(
    roles: Sequence[str] = ("both",), model_path: str = "", disagg: DisaggConfig | None = None
) -> AsyncIterator[RouterService]:
    """A router over one started worker per role (with a KV transfer agent when disaggregated)."""
    runtime = await connect_runtime(None, registry=InProcRegistry())
    service = RouterService(
        discovery=runtime.discovery,
        requests=runtime.requests,
        events=runtime.events,
        config=RouterConfig(block_size=BLOCK),
        disagg=disagg,
    )
    await service.start()
    workers: list[Worker] = []
    agents: list[TransferAgent] = []
    try:
        for i, role in enumerate(roles):
            agent = TransferAgent() if disagg is not None else None
            agents += [agent] if agent is not None else []
            w = timed_worker(f"w{i}", runtime, role=role, model=MODEL, block_size=BLOCK, transfer=agent)
            w.info = msgspec.structs.replace(w.info, model_path=model_path)
            await w.start()
            workers.append(w)
        assert await service.wait_for_workers(len(workers), 5.0) == len(workers)
        yield service
    finally:
        for w in workers:
            await w.close()
        for agent in agents:
            agent.close()
        await service.close()
        await runtime.close()


async def spans_named(exp: InMemorySpanExporter, *names: str) -> dict[str, list[ReadableSpan]]:
    """The finished spans by name, once each of ``names`` has ended (the frontend's ends after
    the client has its response)."""
    deadline = time.monotonic() + 5.0
    while True:
        by_name: dict[str, list[ReadableSpan]] = {}
        for s in exp.get_finished_spans():
            by_name.setdefault(s.name, []).append(s)
        if all(n in by_name for n in names) or time.monotonic() > deadline:
            return by_name
        await asyncio.sleep(0.01)


def parent_id(s: ReadableSpan) -> int | None:
    return s.parent.span_id if s.parent is not None else None


def span_id(s: ReadableSpan) -> int:
    assert s.context is not None
    return s.context.span_id


def trace_id(s: ReadableSpan) -> int:
    assert s.context is not None
    return s.context.trace_id


def test_one_request_is_one_trace_from_the_frontend_to_the_engine(
    exporter: InMemorySpanExporter, smol_path: Path
) -> None:
    async def main() -> None:
        async with fleet(model_path=str(smol_path)) as service:
            server = await serve_frontend(service, "127.0.0.1", 0)
            try:
                async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                    body = {
                        "model": MODEL,
                        "prompt": list(range(10, 31)),
                        "max_tokens": 6,
                        "ignore_eos": True,
                    }
                    header = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
                    r = await client.post("/v1/completions", json=body, headers=header)
                    assert r.status_code == 200, r.text
                by_name = await spans_named(exporter, "http completions", "worker.generate", "engine")
            finally:
                await server.close()
        [http] = by_name["http completions"]
        [route] = by_name["route"]
        [worker] = by_name["worker.generate"]
        [engine] = by_name["engine"]
        # one trace, the client's; the frontend's span its child, everything else below it
        assert {trace_id(s) for s in (http, route, worker, engine)} == {int(CLIENT_TRACE, 16)}
        assert parent_id(http) == int(CLIENT_SPAN, 16)
        assert parent_id(route) == parent_id(worker) == span_id(http)
        assert parent_id(engine) == span_id(worker)
        assert dict(http.attributes or {}) == {
            "http.response.status_code": 200,
            "request_id": r.json()["id"],
            "model": MODEL,
            "prompt_tokens": 21,
            "completion_tokens": 6,
        }
        route_attrs = dict(route.attributes or {})
        assert route_attrs["worker_id"] == "w0" and route_attrs["prompt_tokens"] == 21
        assert {"reason", "overlap_blocks", "predicted_cached_tokens", "candidates"} <= set(route_attrs)
        worker_attrs = dict(worker.attributes or {})
        assert worker_attrs["worker_id"] == "w0" and worker_attrs["finish_reason"] == "length"
        assert worker_attrs["completion_tokens"] == 6 and worker_attrs["prompt_tokens"] == 21
        assert [e.name for e in engine.events] == ["first_token"]
        assert dict(engine.attributes or {})["finish_reason"] == "length"

    asyncio.run(main())


def request(rid: str, max_tokens: int = 4) -> GenerateRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return GenerateRequest(request_id=rid, token_ids=tuple(range(10, 31)), model=MODEL, sampling=sampling)


async def generate(service: RouterService, req: GenerateRequest) -> int:
    """Tokens streamed for ``req`` through the router (no HTTP)."""
    ctx = RequestContext(request_id=req.request_id, endpoint="completions")
    tokens = 0
    async for out in service.generate(req, ctx):
        tokens += len(out.token_ids)
    return tokens


def test_a_disaggregated_request_traces_both_legs_and_the_kv_transfer(exporter: InMemorySpanExporter) -> None:
    async def main() -> None:
        async with fleet(("prefill", "decode"), disagg=DisaggConfig(enforce=True)) as service:
            with tracing.span("client") as root:
                assert await generate(service, request("r")) == 4
            by_name = await spans_named(exporter, "kv.transfer")
        routes = by_name["route"]
        workers = {dict(s.attributes or {})["worker_id"]: s for s in by_name["worker.generate"]}
        [kv] = by_name["kv.transfer"]
        root_id = root.get_span_context().span_id
        assert len(routes) == 2 and {parent_id(s) for s in routes} == {root_id}
        assert {dict(s.attributes or {})["worker_id"] for s in routes} == {"w0", "w1"}
        assert set(workers) == {"w0", "w1"} and {parent_id(s) for s in workers.values()} == {root_id}
        assert parent_id(kv) == span_id(workers["w1"])  # the decode worker pulls
        kv_attrs = dict(kv.attributes or {})
        assert kv_attrs["outcome"] == "imported" and isinstance(n := kv_attrs["bytes"], int) and n > 0
        assert kv_attrs["transport"] and kv_attrs["request_id"] == "r"
        assert len({trace_id(s) for s in exporter.get_finished_spans()}) == 1

    asyncio.run(main())


def test_off_records_nothing_and_costs_one_check() -> None:
    exp = InMemorySpanExporter()
    tracing.configure(True, "test", exporter=exp)
    tracing.configure(False)  # on, then off: the provider is gone

    async def main() -> None:
        async with fleet() as service:
            assert await generate(service, request("r")) == 4

    asyncio.run(main())
    assert exp.get_finished_spans() == ()
    assert not tracing.enabled() and tracing.traceparent() is None
    assert tracing.span("x") is tracing.NO_SPAN and tracing.start_span("x") is tracing.NO_SPAN


def test_off_never_imports_opentelemetry() -> None:
    code = (
        "import sys\n"
        "import interlock.frontend.app, interlock.router.dispatcher, interlock.engine.worker\n"
        "import interlock.engine.disagg, interlock.cluster.runner\n"
        "from interlock.metrics import tracing\n"
        "tracing.configure(False)\n"
        "with tracing.span('x') as s: s.set_attribute('a', 1)\n"
        "tracing.start_span('y').end()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_traceparent_field_is_optional_on_the_wire() -> None:
    class OldRequest(msgspec.Struct, frozen=True, kw_only=True):  # a peer from before the field
        request_id: str
        token_ids: tuple[int, ...]

    old = msgspec.msgpack.encode(OldRequest(request_id="r", token_ids=(1, 2)))
    assert decode_request(old).traceparent is None
    new = msgspec.msgpack.encode(GenerateRequest(request_id="r", token_ids=(1,), traceparent="00-x-y-01"))
    assert msgspec.msgpack.decode(new, type=OldRequest).request_id == "r"


def test_traceparent_round_trips_through_a_string(exporter: InMemorySpanExporter) -> None:
    with tracing.span("a") as a:
        tp = tracing.traceparent()
        assert tp == tracing.traceparent(a)
    assert tracing.traceparent(a) is None  # ended: nothing to parent
    assert tp is not None and tp.startswith("00-")
    child = tracing.start_span("b", parent=tp)
    child.end()
    [_, b] = exporter.get_finished_spans()
    assert parent_id(b) == a.get_span_context().span_id


def test_tracing_without_the_sdk_names_the_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import raises ImportError

    async def never() -> int:
        raise AssertionError("the command must not run")

    assert run_command("interlock worker", never(), log_level="INFO", tracing_on=True) == 2
    assert "pip install opentelemetry-sdk" in capsys.readouterr().err
    assert not tracing.enabled()


def test_serve_frontend_and_worker_take_the_flag_and_serve_hands_it_to_workers(
    exporter: InMemorySpanExporter,
) -> None:
    from interlock.cli import frontend, serve, worker
    from interlock.cluster.builder import worker_env

    for cli in (serve, frontend, worker):
        options = {o for action in cli.build_parser()._actions for o in action.option_strings}
        assert "--tracing" in options, cli.__name__
    assert worker_env()["INTERLOCK_TRACING"] == "1"
    tracing.configure(False)
    assert "INTERLOCK_TRACING" not in worker_env()
