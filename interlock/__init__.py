"""Interlock: the coordination layer for serving LLMs at scale.

    from interlock import Cluster
    with Cluster.local() as cluster:
        cluster.register_model("smollm2", "smollm2")
        instance = cluster.create_serving_instance(model="smollm2", min_replicas=1)
        print(instance.generate("The capital of France is", max_tokens=32))

``Cluster`` and ``ServingInstance`` load on first use (importing ``interlock.errors`` stays cheap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Cluster", "ServingInstance", "__version__"]

if TYPE_CHECKING:
    from interlock.cluster.api import Cluster, ServingInstance


def __getattr__(name: str) -> Any:
    if name in ("Cluster", "ServingInstance"):
        from interlock.cluster import api

        return getattr(api, name)
    raise AttributeError(f"module 'interlock' has no attribute {name!r}")
