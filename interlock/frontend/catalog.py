"""Which models the frontend can serve now, and their tokenizers.

The model list is the backend's (it changes as workers come and go); the tokenizer of each model
folder is loaded once, in a thread so the event loop keeps serving, and concurrent first
requests for the same model share that one load. ``warm`` starts the loads of every served
model before its first request (``/health`` calls it, and says which are still loading), so a
frontend that has just joined does not hold its first requests for a tokenizer (150-400 ms).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

from interlock.errors import ModelNotFound, ServiceError
from interlock.frontend.backend import Backend, ModelEntry
from interlock.frontend.chunked import ChunkedEncoder
from interlock.frontend.tokenizer import ModelTokenizer, load_tokenizer

RETRY_S = 5.0
"""A tokenizer that failed to load is tried again by ``warm`` after this long."""


class ModelCatalog:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._tokenizers: dict[str, ModelTokenizer] = {}
        self._loading: dict[str, asyncio.Future[ModelTokenizer]] = {}
        self._failed: dict[str, tuple[float, str]] = {}
        """Model folder -> (when its last load failed, why): retried by ``warm`` after
        ``RETRY_S``, and by every request."""

    def entries(self) -> list[ModelEntry]:
        return self._backend.models()

    def find(self, name: str) -> ModelEntry:
        for entry in self._backend.models():
            if entry.name == name:
                return entry
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")

    def chunk_samples(self) -> list[tuple[tuple[str, ...], float]]:
        """``interlock_prompt_chunks_total``: the chunk caches' counts over the loaded tokenizers."""
        hit = miss = prompt = 0
        for enc in self._encoders():
            hit, miss, prompt = hit + enc.cache.hits, miss + enc.cache.misses, prompt + enc.prompts.hits
        return [(("chunk_hit",), hit), (("chunk_miss",), miss), (("prompt_hit",), prompt)]

    def cache_tokens(self) -> list[tuple[tuple[str, ...], float]]:
        """``interlock_prompt_cache_tokens``."""
        return [((), sum(enc.cache.tokens + enc.prompts.tokens for enc in self._encoders()))]

    def _encoders(self) -> list[ChunkedEncoder]:
        return [t.chunked for t in self._tokenizers.values() if t.chunked is not None]

    async def warm(self, entries: list[ModelEntry], wait_s: float = 0.0) -> tuple[list[str], list[str]]:
        """Start loading the tokenizer of each of ``entries`` (served models) that has none yet,
        and wait up to ``wait_s`` for them. Returns the models whose tokenizer is still loading,
        and why each whose last load failed did (tried again here after ``RETRY_S``)."""
        now = time.monotonic()
        pending = {}
        for entry in entries:
            fault = self._failed.get(entry.model_path)
            if entry.model_path not in self._tokenizers and (fault is None or now - fault[0] >= RETRY_S):
                pending[entry.model_path] = self._load(entry)
        if pending and wait_s > 0:
            await asyncio.wait([asyncio.shield(f) for f in pending.values()], timeout=wait_s)
        loading, failed = [], []
        for entry in entries:
            fault = self._failed.get(entry.model_path)
            if entry.model_path in self._tokenizers:
                continue
            if entry.model_path in self._loading:
                loading.append(entry.name)
            elif fault is not None:
                failed.append(f"model {entry.name!r}: cannot load its tokenizer: {fault[1]}")
        return loading, failed

    def _load(self, entry: ModelEntry) -> asyncio.Future[ModelTokenizer]:
        path = entry.model_path
        pending = self._loading.get(path)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(load_tokenizer, path))
            self._loading[path] = pending
            pending.add_done_callback(partial(self._loaded, path))
        return pending

    def _loaded(self, path: str, done: asyncio.Future[ModelTokenizer]) -> None:
        self._loading.pop(path, None)
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            self._tokenizers[path] = done.result()
            self._failed.pop(path, None)
        else:
            self._failed[path] = (time.monotonic(), str(exc) or type(exc).__name__)

    async def tokenizer(self, entry: ModelEntry) -> ModelTokenizer:
        tok = self._tokenizers.get(entry.model_path)
        if tok is not None:
            return tok
        try:  # shielded: a client leaving does not cancel the shared load
            return await asyncio.shield(self._load(entry))
        except Exception as exc:  # a broken model folder is the server's fault, not the client's
            raise ServiceError(f"cannot load the tokenizer of model {entry.name!r}: {exc}") from exc
