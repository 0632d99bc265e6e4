"""Which models the frontend can serve now, and their tokenizers.

The model list is the backend's (it changes as workers come and go); the tokenizer of each model
folder is loaded once, in a thread so the event loop keeps serving, and concurrent first
requests for the same model share that one load.
"""

from __future__ import annotations

import asyncio

from interlock.errors import ModelNotFound, ServiceError
from interlock.frontend.backend import Backend, ModelEntry
from interlock.frontend.chunked import ChunkedEncoder
from interlock.frontend.tokenizer import ModelTokenizer, load_tokenizer


class ModelCatalog:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._tokenizers: dict[str, ModelTokenizer] = {}
        self._loading: dict[str, asyncio.Future[ModelTokenizer]] = {}

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

    async def tokenizer(self, entry: ModelEntry) -> ModelTokenizer:
        tok = self._tokenizers.get(entry.model_path)
        if tok is not None:
            return tok
        pending = self._loading.get(entry.model_path)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(load_tokenizer, entry.model_path))
            self._loading[entry.model_path] = pending
            pending.add_done_callback(lambda _: self._loading.pop(entry.model_path, None))
        try:
            tok = await asyncio.shield(pending)  # a client leaving does not cancel the shared load
        except Exception as exc:  # a broken model folder is the server's fault, not the client's
            raise ServiceError(f"cannot load the tokenizer of model {entry.name!r}: {exc}") from exc
        self._tokenizers[entry.model_path] = tok
        return tok
