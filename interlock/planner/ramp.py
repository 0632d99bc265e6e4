"""A new worker's routing weight: it has no cache yet, so it must not receive a flood of cold
requests the moment it joins. Its weight rises linearly from ``floor`` to 1 over ``ramp_s``
seconds after it becomes ready; the router divides its cost (or load) by the weight, so a worker
at weight 0.25 must look four times better than the others to be chosen.
"""

from __future__ import annotations


def routing_weight(age_s: float, ramp_s: float, floor: float) -> float:
    if ramp_s <= 0 or age_s >= ramp_s:
        return 1.0
    return floor + (1.0 - floor) * max(age_s, 0.0) / ramp_s
