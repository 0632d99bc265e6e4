"""Names on the planes shared by workers, routers and frontends (one definition, no typos)."""

from __future__ import annotations

GENERATE_ENDPOINT = "interlock.worker.generate"
"""Endpoint every worker serves; its InstanceInfo says which model."""

KV_ALL = "interlock.kv.>"
LOAD_ALL = "interlock.load.>"
ROUTER_LOAD_ALL = "interlock.router_load.>"


def kv(instance_id: str) -> str:
    """KVEventBatch stream of one worker."""
    return f"interlock.kv.{instance_id}"


def load(instance_id: str) -> str:
    """LoadReport stream of one worker."""
    return f"interlock.load.{instance_id}"


def resync(instance_id: str) -> str:
    """Ask one worker to publish a snapshot of its cache (any payload)."""
    return f"interlock.resync.{instance_id}"


def router_load(router_id: str) -> str:
    """RouterLoadEvent stream of one router (dispatch-time load shared between routers)."""
    return f"interlock.router_load.{router_id}"
