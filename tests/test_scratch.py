"""A vLLM worker's scratch directory (``interlock.scratch``): vLLM's socket files go in it, it
leaves with its process, and a killed process's is removed by the next sweep, never a live
one's or another pid namespace's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from interlock import scratch


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_sweep_removes_the_directories_of_gone_processes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = scratch._namespace()
    gone = tmp_path / f"{scratch.PREFIX}{ns}-{dead_pid()}-abc"
    live = tmp_path / f"{scratch.PREFIX}{ns}-{os.getpid()}-def"
    other_ns = tmp_path / f"{scratch.PREFIX}1-{dead_pid()}-ghi"  # another pid namespace's pid
    unrelated = tmp_path / f"{scratch.PREFIX}{ns}-notapid-x"
    a_file = tmp_path / f"{scratch.PREFIX}{ns}-{dead_pid()}-file"
    for d in (gone, live, other_ns, unrelated):
        d.mkdir()
        (d / "sock").write_text("")
    a_file.write_text("")
    assert scratch.sweep(tmp_path) == [gone]
    assert (
        not gone.exists() and live.exists() and other_ns.exists() and unrelated.exists() and a_file.exists()
    )
    assert scratch.sweep(tmp_path) == []


def test_vllms_socket_path_goes_into_the_process_directory_which_leaves_at_exit(tmp_path: Path) -> None:
    """A process that asks for an engine directory sets ``VLLM_RPC_BASE_PATH`` to its own (an
    operator's value wins) and removes it all when it exits; one killed leaves it to a sweep."""
    code = textwrap.dedent(
        """
        import os, sys
        from interlock import scratch
        d = scratch.engine_dir(sys.argv[1])
        (d / "kv-events").write_text("")
        print(os.environ["VLLM_RPC_BASE_PATH"], d, flush=True)
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), 9)
        """
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("VLLM_RPC_BASE_PATH", None)
    out = subprocess.run(
        [sys.executable, "-c", code, "w/1 ", "exit"], env=env, capture_output=True, text=True
    )
    base, engine = out.stdout.split()
    assert Path(engine).parent == Path(base) and Path(base).parent == tmp_path
    assert Path(base).name.startswith(f"{scratch.PREFIX}{scratch._namespace()}-")
    assert Path(engine).name.startswith("w_1_-")
    long = subprocess.run(
        [sys.executable, "-c", code, "x" * 80, "exit"], env=env, capture_output=True, text=True
    )
    assert len(Path(long.stdout.split()[1]).name) == 16 + 9  # cut: a socket path has room for 107 bytes
    assert not Path(base).exists()  # gone with its process

    killed = subprocess.run(
        [sys.executable, "-c", code, "w2", "kill"], env=env, capture_output=True, text=True
    )
    assert killed.returncode == -9
    base = killed.stdout.split()[0]
    assert Path(base).exists()
    assert scratch.sweep(tmp_path) == [Path(base)]

    env["VLLM_RPC_BASE_PATH"] = str(tmp_path / "operators")
    kept = subprocess.run([sys.executable, "-c", code, "w3", "exit"], env=env, capture_output=True, text=True)
    assert kept.stdout.split()[0] == str(tmp_path / "operators")
