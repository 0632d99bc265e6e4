"""Child processes of a local deployment (``interlock serve``, ``Cluster.local()``): start,
watch, stop; never leave one running.

Each child gets PR_SET_PDEATHSIG (it dies with its parent on Linux, even after a SIGKILL of the
parent), its own output prefixed in ours, and on stop a SIGTERM (the worker drains) followed by
a SIGKILL after the grace period. Each child leads a process group of its own, and once it has
exited whatever is left in that group is killed: a guest engine's processes (vLLM's engine
core) do not die with the worker that started them, and a SIGKILLed worker would leave them
running; the Python shared-memory segments those grandchildren mapped are unlinked once they are
gone (``interlock.shm``: vLLM's message queues, 400 MiB of RAM a death), and a killed vLLM
worker's socket files with them (``interlock.scratch``). Both kinds here
(``Child``, ``NatsProcess``) can be started again after they exit, which is what ``cluster.supervisor`` does with them.
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

from interlock import scratch, shm
from interlock.cluster import logs
from interlock.runtime.config import NatsAuth
from interlock.runtime.nats_permissions import NatsUser
from interlock.runtime.nats_server import NatsServer

log = logging.getLogger(__name__)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setpgid(0, 0)  # a process group of its own (``Child._kill_group``)
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
    stdin_data: bytes | None = None
    """Written to the child's stdin at every start, then closed (a worker's typed spec)."""
    relay: bool = True
    """Its output through this process, each line tagged with its name; False: it writes to
    this process's stdout and stderr itself (a frontend's access lines cost no second process)."""
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
            stdin=subprocess.PIPE if self.stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.relay else None,
            stderr=subprocess.STDOUT if self.relay else None,
            env=env,
            preexec_fn=_die_with_parent,
        )
        if self.stdin_data is not None:
            assert self.process.stdin is not None
            self.process.stdin.write(self.stdin_data)
            self.process.stdin.close()
        if self.relay:
            self._pump = asyncio.create_task(self._relay())

    async def wait(self) -> int:
        """Until this run exits (its output relayed to the end); its returncode."""
        assert self.process is not None
        code = await self.process.wait()
        self._kill_group()
        await self._finish_pump()
        return code

    def _kill_group(self) -> None:
        """SIGKILL what the exited child left in its process group (its grandchildren), and
        unlink the shared-memory segments they mapped that nobody else maps."""
        if self.process is not None and self.process.returncode is not None:
            left = shm.group_members(self.process.pid)
            segments = shm.mapped_by(left)
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if gone := shm.release(segments, exclude=left):
                log.info("%s: unlinked %d shared-memory segments it left", self.name, len(gone))
            scratch.sweep()  # a killed vLLM worker's socket files (its own exit removes them)

    async def _relay(self) -> None:
        assert self.process and self.process.stdout
        prefix = f"[{self.name}] ".encode()
        json_logs = logs.json_logs()
        while line := await self.process.stdout.readline():
            tagged = logs.tag_json_line(line, self.name) if json_logs else None
            sys.stderr.buffer.write(tagged if tagged is not None else prefix + line)
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
        self._kill_group()
        await self._finish_pump()
        return proc.returncode

    async def _finish_pump(self) -> None:
        # A grandchild that inherited the pipe could hold it open: relay for a moment, not forever.
        if self._pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), 1.0)
            except TimeoutError:
                self._pump.cancel()


class NatsProcess:
    """The private nats-server, restartable on the same address: clients reconnect to one URL.

    The first start picks a free port (unless one is given); every later start reuses it, and
    the same credentials (``auth``), so clients log in again as they did.
    """

    name = "nats-server"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = -1,
        poll_s: float = 0.2,
        auth: NatsAuth | None = None,
        users: tuple[NatsUser, ...] = (),
    ) -> None:
        self.auth = auth
        self.users = users
        """Confined logins (one per worker), kept across restarts."""
        self.host = host
        self.port = port
        self.poll_s = poll_s
        self.server: NatsServer | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        proc = self.server._process if self.server else None
        return proc.pid if proc else None

    def returncode(self) -> int | None:
        """None while running (or never started)."""
        proc = self.server._process if self.server else None
        return proc.poll() if proc else None

    async def start(self) -> None:
        old, self.server = self.server, None
        if old is not None:
            old.stop()  # the dead one's temporary folder
        server = NatsServer(host=self.host, port=self.port, auth=self.auth, users=self.users)
        # Started on the event loop's own thread, though it blocks it for the ~30 ms the port
        # takes to accept: PR_SET_PDEATHSIG fires when the *thread* that forked the server ends,
        # and a worker thread of asyncio.to_thread may retire long before serve does.
        self.server = server.start()
        self.port = server.port

    async def add_users(self, users: tuple[NatsUser, ...]) -> None:
        """Let more confined logins in (a worker added at run time), now and after restarts."""
        self.users = (*self.users, *users)
        if self.server is not None:
            await asyncio.to_thread(self.server.add_users, users)

    async def wait(self) -> int:
        # A Popen, not an asyncio process: poll it. A fraction of a second is nothing next to the
        # clients' reconnect delays.
        while (code := self.returncode()) is None:
            await asyncio.sleep(self.poll_s)
        return code

    async def stop(self, grace_s: float = 5.0) -> int | None:
        server, self.server = self.server, None
        proc = server._process if server else None
        if server is not None:
            await asyncio.to_thread(server.stop)
        return proc.returncode if proc else None


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
