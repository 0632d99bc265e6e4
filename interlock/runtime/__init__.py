"""Runtime planes: naming, discovery, request plane, event plane (in-process and NATS).

Start here: ``rt = await connect_runtime(nats_url_or_None, RuntimeConfig(...))`` gives a
``Runtime`` with ``rt.discovery``, ``rt.requests`` and ``rt.events``; the contracts are in
``interlock.runtime.interfaces``.
"""

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
from interlock.runtime.nats_server import NatsServer, generate_auth
from interlock.runtime.runtime import Runtime, connect_runtime
from interlock.runtime.subscription import Subscription

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
