"""Shared fixtures: the real SmolLM2 tokenizer folder, and one frontend over a FakeBackend
running on an ephemeral loopback port in a background thread (so tests use the sync clients).

What a request gets from the fake is chosen by its ``x-route-key`` header: tests register a
``FakeScript`` under a fresh key in ``scripts`` and send that key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from interlock.frontend import (
    FakeBackend,
    FakeScript,
    FrontendConfig,
    FrontendServer,
    ModelEntry,
    RequestContext,
    serve_frontend,
)
from interlock.frontend.tokenizer import ModelTokenizer, load_tokenizer
from interlock.protocol import GenerateRequest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smol"
SMALL_MODEL = "smol-small"
SMALL_CONTEXT = 64


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from interlock.model_store import resolve_model

    return resolve_model("smollm2", progress=False)


@pytest.fixture(scope="session")
def tok(smol_path: Path) -> ModelTokenizer:
    return load_tokenizer(smol_path)


@dataclass
class Served:
    server: FrontendServer
    backend: FakeBackend
    scripts: dict[str, FakeScript] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def script(self, key: str, script: FakeScript) -> dict[str, str]:
        """Register ``script`` under ``key``; returns the headers that select it."""
        self.scripts[key] = script
        return {"x-route-key": key}


@contextlib.contextmanager
def serving(smol_path: Path, config: FrontendConfig | None = None) -> Iterator[Served]:
    """A frontend over a FakeBackend on an ephemeral loopback port, in a background thread."""
    scripts: dict[str, FakeScript] = {}

    def pick(request: GenerateRequest, ctx: RequestContext) -> FakeScript:
        return scripts.get(ctx.route_key or "", FakeScript())

    backend = FakeBackend(
        [ModelEntry(MODEL, str(smol_path), 2048), ModelEntry(SMALL_MODEL, str(smol_path), SMALL_CONTEXT)],
        pick,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    start = serve_frontend(backend, "127.0.0.1", 0, config=config)
    server = asyncio.run_coroutine_threadsafe(start, loop).result(30)
    try:
        yield Served(server, backend, scripts)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="session")
def served(smol_path: Path) -> Iterator[Served]:
    with serving(smol_path) as s:
        yield s
