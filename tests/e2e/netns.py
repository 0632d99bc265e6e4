"""Several "machines" on this one: network namespaces joined by a bridge, for multi-host tests.

Each host is a namespace with its own loopback and one interface, ``eth0``, the end of a veth
pair whose other end is a port of a bridge in a switch namespace of its own. No address is ever
added to this machine's own namespace and no host namespace has a route beyond the bridge, so no
packet can leave. Addresses come from 198.18.0.0/24, the range RFC 2544 sets aside for
benchmarking test networks (routed nowhere).

A process started with ``private_shm`` also gets a /dev/shm of its own (a private mount
namespace with a fresh tmpfs), as a separate machine would: KV transfer then cannot take the
shared-memory path between hosts and must go over TCP, as it would between real machines.

Needs root, the ``ip`` command (iproute2) and ``unshare`` (util-linux); ``unavailable()`` says
which is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

SUBNET = "198.18.0"
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def unavailable() -> str | None:
    """Why namespaces cannot be built here, or None when they can."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"needs the {tool} command ({package})"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    probe = f"ilk{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
    except subprocess.CalledProcessError as e:
        return f"cannot create a namespace with a veth pair: {e.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str

    def argv(self, *cmd: str, private_shm: bool = False) -> list[str]:
        """``cmd`` run on this host (in its namespace); the same process id as ``cmd`` itself."""
        if private_shm:
            cmd = (
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs -o size=1g,mode=1777 tmpfs /dev/shm && exec "$@"',
                "sh",
                *cmd,
            )
        return ["ip", "netns", "exec", self.netns, *cmd]

    @contextlib.contextmanager
    def thread(self) -> Iterator[ThreadPoolExecutor]:
        """One thread whose sockets live on this host (it joins the namespace first)."""
        pool = ThreadPoolExecutor(max_workers=1, initializer=_enter, initargs=(self.netns,))
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def call(self, fn: Callable[[], T], timeout_s: float = 120.0) -> T:
        """``fn()`` in a thread on this host."""
        with self.thread() as pool:
            return pool.submit(fn).result(timeout=timeout_s)


def _enter(netns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    path = f"/var/run/netns/{netns}"
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)
    # Never let a socket of this thread start from the machine's own namespace.
    if os.stat("/proc/thread-self/ns/net").st_ino != os.stat(path).st_ino:
        raise OSError(f"this thread did not enter {netns}")


@contextlib.contextmanager
def hosts(names: Sequence[str]) -> Iterator[dict[str, Host]]:
    """Hosts ``names[i]`` at 198.18.0.(i+1), all on one bridge; torn down on exit, even on failure,
    after every process still running in them was killed."""
    _remove_stale()
    tag = f"ilk{os.getpid()}"
    switch = f"{tag}-sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        out = {}
        for i, name in enumerate(names):
            host = Host(name, f"{tag}-{name}", f"{SUBNET}.{i + 1}")
            _ip("netns", "add", host.netns)
            made.append(host.netns)
            _ip(
                "-n",
                switch,
                "link",
                "add",
                f"p{i}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            )
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            out[name] = host
        yield out
    finally:
        for netns in reversed(made):
            _kill_all_in(netns)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=20)


def _remove_stale() -> None:
    """Namespaces this module made in a test process that was killed before it could clean up."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    for name in (line.split()[0] for line in r.stdout.splitlines() if line.strip()):
        m = re.fullmatch(r"ilk(\d+)-\w+", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _kill_all_in(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


def _kill_all_in(netns: str) -> None:
    """SIGKILL what still runs in a namespace this module made (only our own processes are there)."""
    for _ in range(50):
        r = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=20)
        pids = [int(p) for p in r.stdout.split() if int(p) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
