"""Restart ``interlock serve``'s local processes (workers, the private nats-server) when they die.

The idea, as in systemd's ``Restart=on-failure`` and Kubernetes' CrashLoopBackOff: a process that
exits with a failure is started again after a delay that doubles with each quick failure (0.5 s,
1 s, 2 s, ... capped at 30 s) and drops back to the first step once a run has stayed up for
``stable_s``. A process that failed ``loop_exits`` times within ``loop_window_s`` is *crash
looping*: it is reported (log and ``problems()``, which feeds ``/health``) but still retried at
the capped delay, because the cause (a full disk, a busy GPU, a NATS outage) may go away and
a person would expect the worker to come back by itself.

Every exit the cluster did not decide is restarted, whatever its code: a worker that drained
and exited 0 because someone outside sent it SIGTERM still leaves the fleet a worker short, and
the fleet's size is the cluster's to choose (planner, ``remove_worker``, ``scale_to``). Those
decisions, and serve's own stop, ``forget`` the process (or ``close()``) before stopping it, so
what is still watched when it exits left unasked. A clean exit counts in the backoff and the
crash-loop window like any other (a process that exits 0 at once, over and over, is looping).

Pure decisions (``on_exit``, ``problem``, ``startup_failure``) are plain functions over frozen
values; ``Supervisor`` is the thin async shell that waits on processes and sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from interlock.metrics.events import EVENTS

log = logging.getLogger("interlock.supervisor")
T = TypeVar("T")

CONFIG_ERROR_EXIT = 2
"""What every interlock command exits with on a ConfigError (see ``cluster.runner``)."""


class RestartPolicy(enum.StrEnum):
    NEVER = "never"
    ON_FAILURE = "on-failure"


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    """Delay before the first restart."""
    factor: float = 2.0
    """Each further restart waits this many times longer."""
    cap_s: float = 30.0
    """The longest delay."""
    stable_s: float = 60.0
    """A run this long resets the delay to ``initial_s``."""
    loop_window_s: float = 60.0
    loop_exits: int = 5
    """This many failures within ``loop_window_s``: crash looping."""

    def delay(self, attempt: int) -> float:
        """Delay before restart number ``attempt`` (1-based) of a run of quick failures."""
        return min(self.cap_s, self.initial_s * self.factor ** (attempt - 1))


@dataclass(frozen=True)
class Exit:
    code: int | None
    """Popen's returncode: negative means killed by that signal; None: it could not be started."""
    at: float
    uptime_s: float


@dataclass(frozen=True)
class History:
    """What the decisions need to know about one process's past exits."""

    failures: tuple[float, ...] = ()
    """Times of the failures within the crash-loop window (older ones are dropped)."""
    attempt: int = 0
    """Restarts in the current run of quick failures (0 after a stable run)."""
    total_failures: int = 0
    last: Exit | None = None


@dataclass(frozen=True)
class Restart:
    delay_s: float
    attempt: int
    crash_loop: bool


@dataclass(frozen=True)
class Leave:
    """Not restarted; ``reason`` completes "<name> ..."."""

    reason: str


def describe_exit(code: int | None) -> str:
    if code is None:
        return "failed to start"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def on_exit(
    history: History, exit: Exit, policy: RestartPolicy, backoff: Backoff
) -> tuple[History, Restart | Leave]:
    """The next history and what to do about a process that just exited unasked."""
    recent = tuple(t for t in history.failures if t > exit.at - backoff.loop_window_s) + (exit.at,)
    attempt = 1 if exit.uptime_s >= backoff.stable_s else history.attempt + 1
    history = History(failures=recent, attempt=attempt, total_failures=history.total_failures + 1, last=exit)
    if policy is RestartPolicy.NEVER:
        return history, Leave(
            f"exited with {describe_exit(exit.code)} and is not restarted (--restart-policy never)"
        )
    return history, Restart(backoff.delay(attempt), attempt, len(recent) >= backoff.loop_exits)


@dataclass(frozen=True)
class Running:
    since: float


@dataclass(frozen=True)
class Waiting:
    until: float


@dataclass(frozen=True)
class Left:
    reason: str


Phase = Running | Waiting | Left


def recent_failures(history: History, now: float, backoff: Backoff) -> int:
    return sum(1 for t in history.failures if t > now - backoff.loop_window_s)


def problem(name: str, phase: Phase, history: History, now: float, backoff: Backoff) -> str | None:
    """One line for ``/health`` and people, or None while the process is up and not flapping."""
    if isinstance(phase, Left):
        return f"{name} {phase.reason}"
    n = recent_failures(history, now, backoff)
    looping = n >= backoff.loop_exits
    last = describe_exit(history.last.code) if history.last else "?"
    head = (
        f"{name} is crash looping: exited {n} times in {backoff.loop_window_s:.0f} s (last: {last})"
        if looping
        else None
    )
    if isinstance(phase, Waiting):
        wait = f"restarting in {max(0.0, phase.until - now):.1f} s"
        return f"{head}; {wait}" if head else f"{name} is down ({last}), {wait}"
    return head


def startup_failure(
    histories: Mapping[str, History], policy: RestartPolicy = RestartPolicy.ON_FAILURE
) -> str | None:
    """Why serve should give up before its workers were ever all ready, or None to keep waiting.

    Restarting cannot fix a configuration error (exit code 2, the code every interlock command
    uses for one), and when every worker has failed at least once before serving anything the
    cause is almost certainly shared (model, device, flags): looping on it would hide the error
    behind a "waiting for workers" line. A single worker failing while others come up is the
    case restarts are for, so that one keeps waiting (up to ``--ready-timeout``). Without
    restarts, any worker that failed can never become ready.
    """
    for name, h in histories.items():
        if policy is RestartPolicy.NEVER and h.total_failures > 0:
            return f"{name} exited with {describe_exit(h.last.code if h.last else None)} before it was ready"
        if h.last is not None and h.last.code == CONFIG_ERROR_EXIT:
            return f"{name} exited with code {CONFIG_ERROR_EXIT} (a configuration error) before it was ready"
    if histories and all(h.total_failures > 0 for h in histories.values()):
        lasts = ", ".join(
            f"{name}: {describe_exit(h.last.code if h.last else None)}" for name, h in histories.items()
        )
        return f"every worker exited before it was ready ({lasts})"
    return None


class Process(Protocol):
    """A restartable local process (``procs.Child``, ``procs.NatsProcess``)."""

    name: str

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None:
        """Start a fresh run (also after a previous run exited)."""

    async def wait(self) -> int:
        """Until the current run exits; its returncode."""


@dataclass
class _Watched:
    process: Process
    phase: Phase
    history: History
    task: asyncio.Task[None] | None = None


class Supervisor:
    """Watches started processes and restarts them per ``policy``; ``close()`` before stopping them."""

    def __init__(
        self,
        policy: RestartPolicy = RestartPolicy.ON_FAILURE,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.backoff = backoff or Backoff()
        self._clock = clock
        self._watched: dict[str, _Watched] = {}
        self._closing = asyncio.Event()
        self.restarts: dict[str, int] = {}
        """Restarts by process name, since start (``interlock_worker_restarts_total``)."""

    def watch(self, process: Process) -> None:
        """Watch a process that is already running."""
        assert process.name not in self._watched, process.name
        w = _Watched(process, Running(self._clock()), History())
        self._watched[process.name] = w
        w.task = asyncio.create_task(self._supervise(w), name=f"supervise {process.name}")

    def forget(self, name: str) -> None:
        """Stop watching one process (it is being stopped on purpose): no restart, no report."""
        w = self._watched.pop(name, None)
        if w is not None and w.task is not None:
            w.task.cancel()

    def problems(self) -> list[str]:
        """Human-readable reasons some process is not serving (empty when all is well)."""
        now = self._clock()
        found = (problem(name, w.phase, w.history, now, self.backoff) for name, w in self._watched.items())
        return [p for p in found if p is not None]

    def restart_samples(self) -> list[tuple[tuple[str, ...], float]]:
        """``interlock_worker_restarts_total``'s series, by process name."""
        return [((name,), n) for name, n in sorted(self.restarts.items())]

    def history(self, name: str) -> History:
        return self._watched[name].history

    def stop_restarting(self) -> None:
        """From now on exits are expected (serve is stopping): no restart, no report."""
        self._closing.set()

    async def close(self) -> None:
        """Stop watching and cancel pending restarts; the processes themselves are left to the caller."""
        self.stop_restarting()
        tasks = [w.task for w in self._watched.values() if w.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise(self, w: _Watched) -> None:
        code: int | None = await self._unless_closing(w.process.wait())
        while not self._closing.is_set():
            now = self._clock()
            assert isinstance(w.phase, Running)
            w.history, decision = on_exit(
                w.history, Exit(code, now, now - w.phase.since), self.policy, self.backoff
            )
            if isinstance(decision, Leave):
                w.phase = Left(decision.reason)
                (log.info if code == 0 else log.error)("%s %s", w.process.name, decision.reason)
                return
            w.phase = Waiting(now + decision.delay_s)
            self._log_restart(w.process.name, w.history, decision)
            await self._unless_closing(asyncio.sleep(decision.delay_s))
            if self._closing.is_set():
                return
            w.phase = Running(self._clock())
            try:
                await w.process.start()
            except Exception as e:  # noqa: BLE001 - a failed start is one more failure to back off from
                log.error("%s could not be started: %s", w.process.name, e)
                code = None
                continue
            self.restarts[w.process.name] = self.restarts.get(w.process.name, 0) + 1
            EVENTS.record("restart", w.process.name, f"exit {code}; restart {self.restarts[w.process.name]}")
            log.warning("%s restarted (pid %s)", w.process.name, w.process.pid)
            code = await self._unless_closing(w.process.wait())

    async def _unless_closing(self, aw: Awaitable[T]) -> T | None:
        """``aw``'s result, or None as soon as ``close()`` is called (``aw`` is then cancelled)."""
        work = asyncio.ensure_future(aw)
        closing = asyncio.ensure_future(self._closing.wait())
        await asyncio.wait((work, closing), return_when=asyncio.FIRST_COMPLETED)
        for task in (work, closing):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return work.result() if work.done() and not work.cancelled() else None

    def _log_restart(self, name: str, history: History, r: Restart) -> None:
        last = describe_exit(history.last.code if history.last else None)
        if r.crash_loop:
            log.error(
                "%s is crash looping: exited %d times in %.0f s (last: %s); restart %d in %.1f s",
                name,
                len(history.failures),
                self.backoff.loop_window_s,
                last,
                r.attempt,
                r.delay_s,
            )
        else:
            log.warning("%s exited with %s; restart %d in %.1f s", name, last, r.attempt, r.delay_s)
