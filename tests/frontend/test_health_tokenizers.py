"""``/health`` loads the served models' tokenizers before a load balancer sends anything: at
start-up it says 503 while one is still loading (so the first requests never wait for it), a
model that joins later only makes it ``degraded``, and a folder that has none says why.

A frontend over a ``FakeBackend`` on a loopback port; the loader is slowed where a test needs a
load that outlasts the health check's wait."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from interlock.frontend import FakeBackend, ModelEntry, serve_frontend
from interlock.frontend import catalog as catalog_module
from interlock.frontend.app import HEALTH_WAIT_S
from interlock.frontend.tokenizer import load_tokenizer

SLOW_S = HEALTH_WAIT_S + 1.0


def _slowed(monkeypatch: pytest.MonkeyPatch, slow_paths: set[str]) -> list[str]:
    """Loads of a folder in ``slow_paths`` take ``SLOW_S`` more; returns the folders loaded."""
    loaded: list[str] = []

    def load(path: str) -> object:
        loaded.append(str(path))
        if str(path) in slow_paths:
            time.sleep(SLOW_S)
        return load_tokenizer(path)

    monkeypatch.setattr(catalog_module, "load_tokenizer", load)
    return loaded


@contextlib.asynccontextmanager
async def frontend(*entries: ModelEntry) -> AsyncIterator[tuple[FakeBackend, httpx.AsyncClient]]:
    """A frontend over a ``FakeBackend`` of ``entries`` on a loopback port, and a client of it."""
    backend = FakeBackend(list(entries))
    server = await serve_frontend(backend, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            yield backend, client
    finally:
        await server.close()


def test_the_first_200_comes_with_the_tokenizer_loaded(
    smol_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = _slowed(monkeypatch, set())

    async def main() -> None:
        async with frontend(ModelEntry("m", str(smol_path), 2048)) as (_, c):
            r = await c.get("/health")
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "ok"
            assert loaded == [str(smol_path)]
            body = {"model": "m", "prompt": "Hello", "max_tokens": 2}
            assert (await c.post("/v1/completions", json=body)).status_code == 200
            assert loaded == [str(smol_path)], "the request loaded it again"

    asyncio.run(main())


def test_a_slow_tokenizer_is_503_at_start_and_degraded_once_ready(
    smol_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second folder with the same tokenizer files, slowed: a model that joins later.
    later = tmp_path / "later"
    later.mkdir()
    for f in smol_path.iterdir():
        if f.is_file() and f.suffix not in (".gguf", ".safetensors"):
            (later / f.name).write_bytes(f.read_bytes())
    _slowed(monkeypatch, {str(smol_path), str(later)})

    async def main() -> None:
        async with frontend(ModelEntry("m", str(smol_path), 2048)) as (backend, c):
            r = await c.get("/health")
            assert r.status_code == 503, r.text
            assert "model 'm': its tokenizer is loading" in r.json()["problems"]
            assert r.headers["retry-after"] == "1"
            deadline = time.monotonic() + 30
            while (r := await c.get("/health")).status_code != 200:
                assert time.monotonic() < deadline
            assert r.json()["status"] == "ok"

            backend.entries.append(ModelEntry("late", str(later), 2048))
            r = await c.get("/health")
            assert r.status_code == 200, r.text
            assert r.json()["degraded"] == ["model 'late': its tokenizer is loading"]
            while (r := await c.get("/health")).json()["status"] != "ok":
                assert time.monotonic() < deadline

    asyncio.run(main())


def test_a_folder_without_a_tokenizer_is_named(tmp_path: Path) -> None:
    async def main() -> None:
        async with frontend(ModelEntry("broken", str(tmp_path), 2048)) as (_, c):
            r = await c.get("/health")
            assert r.status_code == 200, r.text
            [why] = r.json()["degraded"]
            assert why.startswith("model 'broken': cannot load its tokenizer: ")
            body = {"model": "broken", "prompt": "Hello", "max_tokens": 2}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 500  # the server's fault; its log says which folder

    asyncio.run(main())
