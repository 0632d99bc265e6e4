"""Walk one chat request from HTTP to the engine and say which files and packages it passes.

Everything in this process (``interlock serve --single-process --runner mock``: the frontend,
the router, the in-process planes and one worker on the mock runner), one warm-up request,
then one traced non-streaming chat request over loopback HTTP (``httpx``). The trace
(``sys.setprofile``, this thread: the event loop's) records each call into a function under
``interlock/``, in order (a coroutine's or generator's resumption is not a call); the walk is that sequence up to the first call into the engine
(``interlock/engine/``, which the worker's handler reaches last), with consecutive calls in one
file folded into one visit.

Reported: files entered, visits, returns (a visit to a file the walk had already left), the
files returned to most, and the walk by package with the same counts; leaf packages that any
layer may call (``protocol``, ``errors``, ``names``, ``kvhash``, ``env``, ``config``-like
modules listed in ``LEAVES``) are left out of the package walk, as a call into them is a step
down and back, not a pass through a layer.

    PYTHONPATH=. .venv/bin/python benchmarks/request_walk.py [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path

import httpx

import interlock
from interlock.cli.serve import build_parser, spec_from_args
from interlock.cluster.builder import RunningCluster

ROOT = str(Path(interlock.__file__).resolve().parent) + "/"
LEAVES = {"protocol", "errors.py", "names.py", "kvhash.py", "env.py", "deploy.py", "__init__.py"}
LAYERS = ("cli", "cluster", "frontend", "router", "runtime", "engine")
"""The request path's layers, top down: a call from one to another above it is upward."""


def _package(rel: str) -> str:
    return rel.split("/", 1)[0]


async def _traced_request(url: str) -> list[tuple[str, str, str]]:
    body: dict = {"model": "", "messages": [{"role": "user", "content": "Where is Paris?"}], "max_tokens": 4}
    calls: list[tuple[str, str, str]] = []  # (callee, caller) files under interlock/, the functions
    entered: set[object] = set()  # frames already entered: a coroutine's resumption is no call
    before: set[asyncio.Task] = set()  # the tasks that ran before the request (not its own)
    current = asyncio.current_task

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame not in entered and current() not in before:
            entered.add(frame)
            f = frame.f_code.co_filename
            if f.startswith(ROOT):
                back = frame.f_back
                caller = back.f_code.co_filename if back is not None else ""
                called = f"{back.f_code.co_name if back else ''} -> {frame.f_code.co_name}"
                calls.append((f[len(ROOT) :], caller[len(ROOT) :] if caller.startswith(ROOT) else "", called))

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        body["model"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        (await client.post("/v1/chat/completions", json=body)).raise_for_status()  # warm-up
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:  # a new connection, a new task
        await asyncio.sleep(0.5)  # the warm-up's tasks done
        before.update(asyncio.all_tasks())
        sys.setprofile(profile)
        try:
            reply = await client.post("/v1/chat/completions", json=body)
        finally:
            sys.setprofile(None)
        reply.raise_for_status()
    return calls


def _visits(seq: list[str]) -> list[str]:
    out: list[str] = []
    for s in seq:
        if not out or out[-1] != s:
            out.append(s)
    return out


def _report(name: str, visits: list[str]) -> None:
    seen: set[str] = set()
    returns: collections.Counter[str] = collections.Counter()
    for i, v in enumerate(visits):
        if v in seen and visits[i - 1] != v:
            returns[v] += 1
        seen.add(v)
    most = ", ".join(f"{f} {n}" for f, n in returns.most_common(5)) or "none"
    print(f"{name}: {len(seen)} entered, {len(visits)} visits, {sum(returns.values())} returns ({most})")


def _edges(name: str, calls: list[tuple[str, str, str]], full: bool = False, judge: bool = True) -> None:
    """Calls from one layer's package into another's, counted; upward ones named; with
    ``full``, each call (caller -> callee)."""
    edges: collections.Counter[tuple[str, str]] = collections.Counter()
    for callee, caller, called in calls:
        a, b = _package(caller), _package(callee)
        if caller and a != b and a in LAYERS and b in LAYERS:
            edges[(a, b)] += 1
            if full:
                print(f"  {caller} -> {callee}: {called}")
    listed = ", ".join(f"{a}->{b} {n}" for (a, b), n in sorted(edges.items()))
    if not judge:  # both ways: the replies come back up by design
        print(f"{name}: {listed}")
        return
    up = {e: n for e, n in edges.items() if LAYERS.index(e[0]) > LAYERS.index(e[1])}
    print(f"{name}: {listed}; upward: {up or 'none'}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="print the walk, file by file")
    args = ap.parse_args()
    serve_args = build_parser().parse_args(["--single-process", "--runner", "mock", "--port", "0"])
    running = RunningCluster(spec_from_args(serve_args))
    try:
        await running.start()
        why = await running.wait_ready(stop=asyncio.Event(), progress=False)
        assert why is None, why
        assert running.server is not None
        calls = await _traced_request(running.server.url)
    finally:
        await running.close()
    files = [callee for callee, _, _ in calls]
    first_engine = next((i for i, c in enumerate(files) if c.startswith("engine/")), len(files))
    down = _visits(files[: first_engine + 1])
    _report("files, HTTP to the engine", down)
    packages = _visits([_package(c) for c in files[: first_engine + 1] if _package(c) not in LEAVES])
    _report("packages, HTTP to the engine (leaves left out)", packages)
    print("package walk:", " -> ".join(packages))
    _report("files, the whole request (both ways)", _visits(files))
    _edges("calls between packages, HTTP to the engine", calls[: first_engine + 1], args.full)
    _edges("calls between packages, the whole request", calls, judge=False)
    if args.full:
        print("\n".join(down))


if __name__ == "__main__":
    asyncio.run(main())
