"""Shared fixtures for the bench tests: a fake server runner and a tiny real tokenizer."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp
import pytest

from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.vocab import COMMON_WORDS

T = TypeVar("T")


def with_server(timing: FakeTiming, body: Callable[[FakeOpenAIServer], Awaitable[T]]) -> T:
    """Start a fake server on an ephemeral loopback port, run ``body`` against it, stop it."""

    async def go() -> T:
        server = FakeOpenAIServer(timing)
        await server.start()
        try:
            await _warm_up(server)
            return await asyncio.wait_for(body(server), timeout=30)
        finally:
            await server.stop()

    return asyncio.run(go())


async def _warm_up(server: FakeOpenAIServer) -> None:
    """One request first: the first request of a process pays one-off costs (lazy imports)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}
        ) as resp:
            await resp.read()
    server.received.clear()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained in milliseconds on common words: a real tokenizer.json, no hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [" ".join(rng.choices(COMMON_WORDS, k=30)) for _ in range(300)]
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=["<eos>"], show_progress=False)
    )
    folder = tmp_path_factory.mktemp("tok")
    tok.save(str(folder / "tokenizer.json"))
    return folder
