"""KV-aware router: decides which worker serves each request.

Pure parts here (no I/O): ``KvIndexer`` (who caches what), ``LoadTracker`` (dispatch-time load
merged with reports), ``cost`` (estimated time to first token), policies, and the per-model
``Router`` (``model_router``) the async glue (``interlock.router.service``) drives.
"""

from interlock.router.admission import AdmissionQueue, Pending, RequestMeta
from interlock.router.cost import CostParams
from interlock.router.decision import Candidate, Decision, RouterMetrics
from interlock.router.indexer import ApplyResult, KvIndexer
from interlock.router.load import LoadTracker
from interlock.router.model_router import Router, RouterConfig
from interlock.router.policies import POLICIES

__all__ = [
    "POLICIES",
    "AdmissionQueue",
    "ApplyResult",
    "Candidate",
    "CostParams",
    "Decision",
    "KvIndexer",
    "LoadTracker",
    "Pending",
    "RequestMeta",
    "Router",
    "RouterConfig",
    "RouterMetrics",
]
