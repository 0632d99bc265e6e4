"""Turn a ``PlannerConfig`` into a ``Planner`` (reads the capability profile: the one I/O)."""

from __future__ import annotations

from interlock.planner.config import PlannerConfig
from interlock.planner.core import Planner
from interlock.planner.profile import CapabilityProfile, load_profile
from interlock.planner.reactive import ReactivePolicy
from interlock.planner.sla import SlaPolicy


def build_planner(config: PlannerConfig, profile: CapabilityProfile | None = None) -> Planner:
    """``profile``: already loaded (tests, the simulator); else read from ``config.profile``."""
    if config.policy == "reactive":
        return Planner(config, ReactivePolicy(config))
    if profile is None:
        assert config.profile is not None  # PlannerConfig checks it for "sla"
        profile = load_profile(config.profile)
    return Planner(config, SlaPolicy(config, profile))
