"""A stand-in worker process for the kill tests: registers and streams tokens until killed.

Run as ``python -m tests.runtime.worker_process NATS_URL NAMESPACE REQUEST_PLANE``; prints
``ready`` once registered.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import replace

from interlock.protocol import InstanceInfo
from interlock.runtime import CallContext, EndpointName, connect_runtime

from .conftest import FAST


async def tokens(payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
    while True:
        yield b"tok"
        await asyncio.sleep(0.01)


async def main(nats_url: str, namespace: str, request_plane: str) -> None:
    runtime = await connect_runtime(nats_url, replace(FAST, request_plane=request_plane))  # type: ignore[arg-type]
    name = EndpointName(namespace, "worker", "generate")
    address = await runtime.requests.serve(name, tokens, instance_id="w1")
    await runtime.discovery.register(
        InstanceInfo(instance_id="w1", endpoint=str(name), model="m", address=address)
    )
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
