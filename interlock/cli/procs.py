"""Child processes of ``interlock serve``: start, watch, stop — never leave one running.

Each child gets PR_SET_PDEATHSIG (it dies with its parent on Linux, even after a SIGKILL of the
parent), its own output prefixed in ours, and on stop a SIGTERM (the worker drains) followed by
a SIGKILL after the grace period.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the atexit stop still applies
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None
    _pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        env = {**os.environ, **self.env}
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
        )
        self._pump = asyncio.create_task(self._relay())

    async def _relay(self) -> None:
        assert self.process and self.process.stdout
        prefix = f"[{self.name}] ".encode()
        while line := await self.process.stdout.readline():
            sys.stderr.buffer.write(prefix + line)
            sys.stderr.buffer.flush()

    async def stop(self, grace_s: float) -> int | None:
        proc = self.process
        if proc is None:
            return None
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("%s did not stop within %.0fs: killing it", self.name, grace_s)
                proc.kill()
                await proc.wait()
        if self._pump is not None:
            try:
                await asyncio.wait_for(self._pump, 1.0)
            except TimeoutError:
                self._pump.cancel()
        return proc.returncode


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
