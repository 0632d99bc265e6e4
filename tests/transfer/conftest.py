"""Fixtures: a local agent, and peer processes that are always killed at teardown."""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import TransferAgent
from interlock.transfer.staging import list_segments
from tests.transfer import peers

_ctx = mp.get_context("spawn")


class Peer:
    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.conn, child = _ctx.Pipe()
        self.proc = _ctx.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()
        self.address = ""
        """The peer agent's TCP address, when it is one."""

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def recv(self, timeout: float = 20.0) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError("peer did not answer")
        return self.conn.recv()

    def call(self, *cmd: Any, timeout: float = 20.0) -> Any:
        self.conn.send(cmd)
        return self.recv(timeout)

    def offer(self, nbytes: int, seed: int, timeout_s: float = 10.0) -> TransferDescriptor:
        return msgspec.msgpack.decode(self.call("offer", nbytes, seed, timeout_s), type=TransferDescriptor)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)

    def stop(self, *, graceful: bool = False) -> None:
        if graceful and self.proc.is_alive():
            try:
                self.conn.send(("exit",))
            except OSError:
                pass
            self.proc.join(timeout=5)
        self.kill()
        self.conn.close()


@pytest.fixture(scope="session")
def agent() -> Iterator[TransferAgent]:
    """Without buffer reuse, so every ended transfer must have unlinked its segment."""
    with TransferAgent(tick_s=0.05, pool_bytes=0) as a:
        yield a


@pytest.fixture(scope="session")
def remote() -> Iterator[Peer]:
    """One long-lived agent in another process."""
    peer = Peer(peers.agent_peer)
    ready, peer.address, _ = peer.recv()
    assert ready == "ready"
    yield peer
    peer.stop(graceful=True)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Peer]]:
    started: list[Peer] = []

    def start(target: Callable[..., None], *args: Any) -> Peer:
        started.append(Peer(target, *args))
        return started[-1]

    yield start
    for peer in started:
        peer.stop()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def connection_fd_targets() -> set[str]:
    """Sockets this process holds open."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


@pytest.fixture
def own_segments() -> Callable[[], list[str]]:
    """This process's /dev/shm segments made since the test began: what the test must not leave.

    Segments from before it (another test's module-scoped agent keeps its recycled buffers until
    the module ends) are not this test's to answer for.
    """
    before = set(list_segments(os.getpid()))
    return lambda: sorted(set(list_segments(os.getpid())) - before)
