"""Where a vLLM worker's files on disk go, and how they leave (beside ``shm``, its segments).

vLLM makes a ZeroMQ socket file for each of its channels in ``VLLM_RPC_BASE_PATH`` (the temp
directory by default) and never removes them: 7 files a start, a few hundred a day on a host
whose workers restart. The worker's own KV event endpoints are socket files too. Both go into
one directory per worker process, ``interlock-vllm-<ns>-<pid>-*`` in the temp directory
(``process_dir``; ``<ns>``: this pid namespace, so that hosts sharing a temp directory never
mistake each other's pids), removed when the process exits. A process that was killed cannot
remove its own: the next worker that starts on the host, and the supervisor that saw it exit
(``cluster.procs``), remove every such directory whose process is gone (``sweep``).

An operator's own ``VLLM_RPC_BASE_PATH`` wins: vLLM's sockets then go there, and stay theirs.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "interlock-vllm-"


def _namespace() -> str:
    """This process's pid namespace (its inode), or "host" where /proc does not say."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's, alive
    return True


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories in ``root`` (the temp directory) of processes of this pid
    namespace that are gone; returns those removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    mine = f"{PREFIX}{_namespace()}-"
    gone = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(mine):
            continue
        pid_text = entry.name[len(mine) :].partition("-")[0]
        if not pid_text.isdigit() or _alive(int(pid_text)) or not entry.is_dir(follow_symlinks=False):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        gone.append(Path(entry.path))
    if gone:
        log.info("removed %d scratch directories of vLLM workers that were killed", len(gone))
    return gone


@cache
def process_dir() -> Path:
    """This process's scratch directory (made once, after a ``sweep``; removed at exit), and
    vLLM's ``VLLM_RPC_BASE_PATH`` unless the operator set one."""
    sweep()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_namespace()}-{os.getpid()}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(path))
    return path


def engine_dir(name: str) -> Path:
    """A directory of one engine's own inside ``process_dir`` (its KV event endpoints), its
    name cut to 16 characters: a socket's path has room for 107 bytes."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:16] or "engine"
    return Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=process_dir()))
