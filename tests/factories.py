"""Small real objects the tests build again and again, with neutral defaults: name only what a
test is about."""

from __future__ import annotations

from typing import Any

from interlock.protocol import LoadReport


def load_report(instance_id: str = "w", **fields: Any) -> LoadReport:
    """An idle worker's report (nothing running, nothing computed), but for ``fields``."""
    base: dict[str, Any] = {
        "timestamp": 0.0,
        "num_running": 0,
        "num_waiting": 0,
        "kv_blocks_used": 0,
        "kv_blocks_total": 64,
        "queued_prefill_tokens": 0,
        "step_time_s": 0.0,
        "tokens_computed": 0,
    }
    return LoadReport(instance_id=instance_id, **{**base, **fields})
