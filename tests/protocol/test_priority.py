"""One meaning of ``priority`` end to end (``interlock.protocol.generate``): lower values first,
the router's admission queue and an engine's waiting queue agree on the order."""

from __future__ import annotations

from interlock.engine.block_pool import BlockPool
from interlock.engine.config import SchedulerConfig
from interlock.engine.kv_cache_manager import KVCacheManager
from interlock.engine.request import Request
from interlock.engine.scheduler import Scheduler
from interlock.protocol import SamplingParams
from interlock.router.admission import AdmissionQueue, RequestMeta

PRIORITIES = {"a": 0, "b": 5, "c": -2, "d": 0, "e": 5, "f": -2, "g": 7}


def test_router_queue_and_engine_waiting_queue_agree() -> None:
    queue = AdmissionQueue(capacity=100)
    for rid, prio in PRIORITIES.items():
        queue.push(RequestMeta(request_id=rid, prompt_tokens=4, priority=prio), (), 0.0)
    router_order = [queue.pop().meta.request_id for _ in PRIORITIES]

    sched = Scheduler(SchedulerConfig(max_num_seqs=1), KVCacheManager(BlockPool(16, 4)))
    for arrival, (rid, prio) in enumerate(PRIORITIES.items()):
        sched.add_request(
            Request(
                rid, (1, 2, 3, 4), SamplingParams(max_tokens=2), block_size=4, priority=prio, arrival=arrival
            )
        )
    engine_order = [r.request_id for r in sched.waiting]

    assert router_order == engine_order == ["c", "f", "a", "d", "b", "e", "g"]
