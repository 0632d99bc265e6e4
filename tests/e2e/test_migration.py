"""A worker SIGKILLed mid-stream changes nothing the client sees (issue 15's identity test).

Real parts: SmolLM2 in fp32 (one thread: the same reduction order everywhere) in ``interlock
worker`` processes over a private nats-server, the router and the HTTP frontend in this
process, the official ``openai`` client. 20 requests — streaming and not, chat and completions,
``logprobs`` on some, two seeded at temperature 0.8 — run once pinned to worker B (the
reference), then pinned to worker A, which is SIGKILLed once a streaming request has seen a
random number of tokens. Every request then finishes on B, and every text (and logprob token)
equals the reference. The same again disaggregated: prefill P, decode D1 killed, D2 takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import openai
import pytest

from interlock.deploy import Routing
from tests.disagg.procs import ProcCluster, proc_cluster

pytestmark = pytest.mark.slow

TORCH = (
    "--runner",
    "torch",
    "--dtype",
    "float32",
    "--threads",
    "1",
    "--block-size",
    "16",
    "--num-blocks",
    "512",
    "--max-num-batched-tokens",
    "256",
    "--max-model-len",
    "1024",
)
SYSTEM = "You are a careful assistant for a hardware shop. Answer briefly and never invent prices."
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Write a haiku about the sea.",
    "Explain what a CPU does.",
    "Who wrote Hamlet?",
    "Do you sell soldering irons?",
    "Which screwdriver for laptops?",
    "Is this drill cordless?",
    "What glue holds metal?",
    "Can I return a saw?",
    "Which multimeter for beginners?",
    "List four planets.",
    "Why is the sky blue?",
    "Translate 'good morning' to French.",
    "Give me a synonym for fast.",
    "What does RAM stand for?",
    "How many legs has a spider?",
    "Describe a kettle in one line.",
    "What is a torque wrench?",
]
MAX_TOKENS = 24


@dataclass(frozen=True)
class Ask:
    i: int
    stream: bool
    chat: bool
    logprobs: bool
    seeded: bool


ASKS = [
    Ask(i, stream=i % 2 == 0, chat=i % 4 < 2, logprobs=i % 5 == 1, seeded=i in (3, 10))
    for i in range(len(QUESTIONS))
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def frontend(c: ProcCluster) -> AsyncIterator[openai.AsyncOpenAI]:
    from interlock.frontend.app import serve_frontend

    server = await serve_frontend(c.service, "127.0.0.1", free_port())
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    try:
        yield client
    finally:
        await client.close()
        await server.close()


async def ask(
    client: openai.AsyncOpenAI, model: str, a: Ask, pin: str, progress: dict[int, int]
) -> tuple[str, list[str]]:
    """The text and the logprob tokens; ``progress[i]`` counts streamed chunks with text."""
    common: dict[str, object] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "extra_headers": {"x-worker-id": pin},
    }
    if a.seeded:
        common.update(temperature=0.8, seed=1234)
    else:
        common.update(temperature=0.0)
    if a.chat:
        messages = [{"role": "system", "content": SYSTEM}] if a.i % 3 == 0 else []
        messages.append({"role": "user", "content": QUESTIONS[a.i]})
        kw = dict(common, messages=messages)
        if a.logprobs:
            kw.update(logprobs=True, top_logprobs=2)
        if not a.stream:
            r = await client.chat.completions.create(**kw)  # type: ignore[call-overload]
            lp = [t.token for t in r.choices[0].logprobs.content] if a.logprobs else []
            return r.choices[0].message.content or "", lp
        text, lp = "", []
        async for chunk in await client.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                if a.logprobs and chunk.choices[0].logprobs is not None:
                    lp += [t.token for t in chunk.choices[0].logprobs.content or []]
                progress[a.i] = progress.get(a.i, 0) + 1
        return text, lp
    kw = dict(common, prompt=QUESTIONS[a.i])
    if a.logprobs:
        kw.update(logprobs=2)
    if not a.stream:
        r = await client.completions.create(**kw)  # type: ignore[call-overload]
        return r.choices[0].text, (list(r.choices[0].logprobs.tokens) if a.logprobs else [])
    text, lp = "", []
    async for chunk in await client.completions.create(stream=True, **kw):  # type: ignore[call-overload]
        if chunk.choices:
            text += chunk.choices[0].text
            if a.logprobs and chunk.choices[0].logprobs is not None:
                lp += list(chunk.choices[0].logprobs.tokens or [])
            progress[a.i] = progress.get(a.i, 0) + 1
    return text, lp


async def run(
    client: openai.AsyncOpenAI, model: str, pin: str, *, kill: tuple[ProcCluster, int] | None = None
) -> list[tuple[str, list[str]]]:
    progress: dict[int, int] = {}
    tasks = [asyncio.create_task(ask(client, model, a, pin, progress)) for a in ASKS]
    if kill is not None:
        cluster, after = kill
        watched = ASKS[0].i  # a streaming request
        while progress.get(watched, 0) < after:
            assert not tasks[0].done(), "the watched request ended before the kill"
            await asyncio.sleep(0.005)
        await asyncio.to_thread(cluster.kill, pin)
    return list(await asyncio.gather(*tasks))


async def check(c: ProcCluster, victim: str, survivor: str) -> None:
    async with frontend(c) as client:
        model = c.service.models()[0].name
        reference = await run(client, model, survivor)
        after = random.Random(15).randint(2, 8)
        disturbed = await run(client, model, victim, kill=(c, after))
        for a, ref, got in zip(ASKS, reference, disturbed, strict=True):
            assert got == ref, f"request {a} differs after the kill: {got!r} != {ref!r}"
        migrations = c.service.dispatcher.metrics.migrations
        assert migrations >= 1, "no request was migrated"
        assert c.service.dispatcher.metrics.migrations_exhausted == 0


def test_aggregated_worker_killed_mid_stream_output_identical() -> None:
    async def main() -> None:
        async with proc_cluster(Routing()) as c:
            c.spawn("a", "both", *TORCH)
            c.spawn("b", "both", *TORCH)
            await c.wait_for(2, timeout_s=180.0)
            await check(c, "a", "b")

    asyncio.run(main())


def test_disaggregated_decode_worker_killed_mid_stream_output_identical() -> None:
    async def main() -> None:
        async with proc_cluster(Routing(enforce_disagg=True)) as c:
            c.spawn("p", "prefill", *TORCH, "--kv-transfer", "auto")
            c.spawn("d1", "decode", *TORCH, "--kv-transfer", "auto")
            c.spawn("d2", "decode", *TORCH, "--kv-transfer", "auto")
            await c.wait_for(3, timeout_s=180.0)
            await check(c, "d1", "d2")

    asyncio.run(main())
