"""The planner: adapts the fleet to the traffic in small steps (grow, shrink, switch roles).

A pure decision core (``Planner.decide``: an ``Observation`` in, at most one ``Action`` out,
with its reason) under two policies (``reactive``, ``sla``), and connectors that observe a fleet
and carry actions out: the replay simulator (``interlock.sim.planned``) and live processes
through the ``Fleet`` seam (``planner.fleet``, ``planner.loop``).
"""

from interlock.planner.build import build_planner
from interlock.planner.config import PLANNER_POLICIES, PlannerConfig, RoleBounds, parse_planner_config
from interlock.planner.core import Planner
from interlock.planner.profile import CapabilityProfile, DecodePoint, PrefillPoint, load_profile
from interlock.planner.ramp import routing_weight
from interlock.planner.state import (
    Action,
    AddWorker,
    Arrival,
    DecisionRecord,
    Observation,
    RemoveWorker,
    SwitchRole,
    Traffic,
    WorkerView,
)

__all__ = [
    "PLANNER_POLICIES",
    "Action",
    "AddWorker",
    "Arrival",
    "CapabilityProfile",
    "DecisionRecord",
    "DecodePoint",
    "Observation",
    "Planner",
    "PlannerConfig",
    "PrefillPoint",
    "RemoveWorker",
    "RoleBounds",
    "SwitchRole",
    "Traffic",
    "WorkerView",
    "build_planner",
    "load_profile",
    "parse_planner_config",
    "routing_weight",
]
