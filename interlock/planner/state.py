"""What the planner sees and what it decides: plain frozen values, no I/O.

An ``Observation`` is one snapshot of the fleet at ``now`` (seconds on whatever clock the
connector uses: real or virtual); the planner answers with at most one ``Action``, each with
its reason. Connectors build observations from what they can see (the router's load view, the
simulator's workers) and carry actions out (start or stop processes, simulated workers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from interlock.protocol.events import LoadReport

INF = float("inf")


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: str
    role: str
    """"both", "prefill" or "decode" (``protocol.discovery.ROLES``)."""
    num_running: int = 0
    num_waiting: int = 0
    queued_prefill_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    """Measured prefill speed (0: not measured yet)."""
    kv_usage: float = 0.0
    """Fraction of the worker's KV blocks in use."""
    decode_step_s: float = 0.0
    """Measured time of one decode step at its current batch (0: not measured yet): the
    inter-token time its running requests see."""
    unique_blocks: int = 0
    """Cached blocks no other worker holds (lost if this worker goes)."""
    ready: bool = True
    """False while it starts (it costs a worker but serves nothing yet)."""
    draining: bool = False
    """Being removed: no new requests; it leaves the pool."""
    age_s: float = INF
    """Seconds since it became ready (for the routing-weight ramp)."""
    weights_out_s: float = 0.0
    """Its model offloaded its weights while idle: the seconds they take to come back (its
    report's ``weights_load_s``); 0 while they are in."""

    @property
    def in_flight(self) -> int:
        return self.num_running + self.num_waiting

    @classmethod
    def of(
        cls,
        worker_id: str,
        role: str,
        report: LoadReport | None,
        *,
        unique_blocks: int = 0,
        ready: bool = True,
        draining: bool = False,
        age_s: float = INF,
    ) -> WorkerView:
        """A worker as its last load report shows it (no report yet: idle)."""
        if report is None:
            return cls(
                worker_id, role, unique_blocks=unique_blocks, ready=ready, draining=draining, age_s=age_s
            )
        return cls(
            worker_id,
            role,
            num_running=report.num_running,
            num_waiting=report.num_waiting,
            queued_prefill_tokens=report.queued_prefill_tokens,
            prefill_tokens_per_s=report.prefill_tokens_per_s,
            kv_usage=report.kv_usage,
            decode_step_s=report.decode_step_s,
            unique_blocks=unique_blocks,
            ready=ready,
            draining=draining,
            age_s=age_s,
            weights_out_s=report.weights_load_s,
        )


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the SLA policy's tail model needs it (``planner.tail``)."""

    at: float
    """When it arrived (the observation's clock)."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens expected from a prefix cache (the router's estimate)."""
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Traffic:
    """Requests that arrived during the last ``duration_s`` (for the SLA policy's forecast)."""

    duration_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens expected from prefix caches (the router's estimate)."""
    output_tokens: int = 0
    finished: int = 0
    """Requests that finished during the interval (0: the connector does not see them)."""
    met: int = 0
    """Of those, how many met both the TTFT and the ITL target."""
    decode_tokens: int = 0
    """Output tokens decoded during the interval (each after its request's first token; 0:
    the connector does not see them)."""
    decode_s: float = 0.0
    """Sum of those tokens' inter-token times: ``decode_s / decode_tokens`` is the inter-token
    time the decoding pool delivered, prefill chunks sharing its steps included."""
    arrivals: tuple[Arrival, ...] = ()
    """The requests one by one, when the connector sees them (the replay: those that arrived
    during the interval; live: those that finished, with their arrival time); empty: the SLA
    policy sizes from means alone."""


@dataclass(frozen=True, slots=True)
class Observation:
    now: float
    workers: tuple[WorkerView, ...]
    router_queue: int = 0
    """Requests waiting in the router's admission queue (every worker busy, or none yet)."""
    traffic: Traffic = Traffic()
    room: int | None = None
    """More workers the hosts can still place (``planner.placement``); None: no limit known."""
    room_reason: str = ""
    """Why ``room`` is what it is (said in a hold when the planner cannot grow)."""
    startup_s: float = 0.0
    """Seconds until capacity asked for now serves: the measured time from "add" to "serving"
    of a new worker of this fleet (0: not measured yet), plus the return time of weights its
    workers offloaded while idle (``WorkerView.weights_out_s``, the longest): what a pool of
    offloaded workers is slow to give back counts as start-up, so the policies add earlier and
    remove later by it (``with_returns``)."""

    @staticmethod
    def with_returns(startup_s: float, workers: Sequence[WorkerView]) -> float:
        """``startup_s`` plus the longest return of offloaded weights among ``workers``."""
        return startup_s + max((w.weights_out_s for w in workers if not w.draining), default=0.0)

    def pool(self, role: str) -> list[WorkerView]:
        """Workers of ``role`` that count towards it: started or starting, not draining."""
        return [w for w in self.workers if w.role == role and not w.draining]


@dataclass(frozen=True, slots=True)
class AddWorker:
    role: str
    reason: str


@dataclass(frozen=True, slots=True)
class RemoveWorker:
    """Stop routing to it, let it finish (or migrate) what it holds, then stop it."""

    worker_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SwitchRole:
    worker_id: str
    role: str
    reason: str


Action = AddWorker | RemoveWorker | SwitchRole


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision as logged and listed by ``interlock planner status``."""

    at: float
    action: Action

    @property
    def kind(self) -> str:
        return {AddWorker: "add", RemoveWorker: "remove", SwitchRole: "switch"}[type(self.action)]

    def line(self) -> str:
        return self.line_of(self.to_dict())

    @staticmethod
    def line_of(d: dict[str, object]) -> str:
        """One line for a decision as ``to_dict`` gives it (also read back over HTTP)."""
        what = {
            "add": "add {role} worker",
            "remove": "remove {worker_id}",
            "switch": "switch {worker_id} to {role}",
        }[str(d["kind"])].format(**d)
        when = f"{d['time']} " if "time" in d else ""  # wall-clock, where the loop stamped it
        return f"{when}t={float(d['at']):.1f}s {what}: {d['reason']}"  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        a = self.action
        out: dict[str, object] = {"at": self.at, "kind": self.kind, "reason": a.reason}
        if isinstance(a, AddWorker | SwitchRole):
            out["role"] = a.role
        if isinstance(a, RemoveWorker | SwitchRole):
            out["worker_id"] = a.worker_id
        return out
