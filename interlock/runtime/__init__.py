"""Runtime planes: naming, discovery, request plane, event plane (in-process and NATS).

Start here: ``rt = await connect_runtime(nats_url_or_None, RuntimeConfig(...))`` gives a
``Runtime`` with ``rt.discovery``, ``rt.requests`` and ``rt.events``; the contracts are in
``interlock.runtime.interfaces``.
"""

import importlib
from typing import TYPE_CHECKING

from interlock.runtime.config import NatsAuth, RuntimeConfig
from interlock.runtime.inproc import InProcRegistry
from interlock.runtime.interfaces import (
    CallContext,
    Discovery,
    DiscoveryEvent,
    EventPlane,
    Handler,
    RequestPlane,
)
from interlock.runtime.naming import EndpointName, subject_matches
from interlock.runtime.subscription import Subscription

if TYPE_CHECKING:
    from interlock.runtime.nats_server import NatsServer, generate_auth
    from interlock.runtime.runtime import Runtime, connect_runtime

_LAZY = {
    "NatsServer": "interlock.runtime.nats_server",
    "generate_auth": "interlock.runtime.nats_server",
    "Runtime": "interlock.runtime.runtime",
    "connect_runtime": "interlock.runtime.runtime",
}
"""Names whose modules import the NATS client (and aiohttp under it, ~0.4 s): loaded when first
used, so code that needs only the contracts (a router, a replay) does not pay for them."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "CallContext",
    "Discovery",
    "DiscoveryEvent",
    "EndpointName",
    "EventPlane",
    "Handler",
    "InProcRegistry",
    "NatsAuth",
    "NatsServer",
    "RequestPlane",
    "Runtime",
    "RuntimeConfig",
    "Subscription",
    "connect_runtime",
    "generate_auth",
    "subject_matches",
]
