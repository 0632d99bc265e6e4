"""CPU cost of the frontend's API-key check per request (issue 16), isolated from the noise of a
whole server: the auth middleware with no keys configured (what every request pays anyway) and
with one key, called on a mocked request ``--n`` times, CPU time per call.

    PYTHONPATH=. .venv/bin/python benchmarks/auth_overhead.py

Compare with the frontend's CPU per request from ``benchmarks/framework_overhead.py`` (about
1 ms at c=64): the end-to-end share of the check is this difference divided by that.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from interlock.frontend.auth import Auth, AuthConfig

KEY = "sk-" + "k" * 40


async def _handler(request: web.Request) -> web.StreamResponse:
    return web.Response()


async def per_call_us(auth: Auth, headers: dict[str, str], n: int) -> float:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=headers)
    middleware = auth.middleware
    start = time.process_time()
    for _ in range(n):
        await middleware(request, _handler)
    return (time.process_time() - start) / n * 1e6


async def main(n: int, rounds: int) -> None:
    for _ in range(rounds):
        off = await per_call_us(Auth(AuthConfig()), {}, n)
        on = await per_call_us(Auth(AuthConfig(api_keys=(KEY,))), {"Authorization": f"Bearer {KEY}"}, n)
        print(
            f"auth middleware per request: no keys {off:.2f} us, one key {on:.2f} us, "
            f"the key check {on - off:.2f} us"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.n, a.rounds))
