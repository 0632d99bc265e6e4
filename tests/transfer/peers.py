"""Peer processes for the transfer tests: a scripted agent, and fakes of stalled TCP peers.

Run in child processes started with the "spawn" method; commands and replies go over a
multiprocessing pipe as plain tuples (descriptors as msgpack bytes).
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
from multiprocessing.connection import Connection

import msgspec

from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import TransferAgent
from interlock.transfer import frames as fr
from interlock.transfer.staging import list_segments


def payload(nbytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(nbytes)


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def agent_peer(conn: Connection, pool_bytes: int = 0) -> None:
    """Obeys ("offer", nbytes, seed, timeout_s), ("stream", nbytes, seed, timeout_s, upto),
    ("status", tid, wait_s), ("pull", descriptor, transport, hold), ("segments",), ("exit",).
    "stream" publishes first, then writes the payload's first ``upto`` bytes, marks them ready
    and stops there (a source that dies or stalls mid-payload)."""
    import os

    held = []
    with TransferAgent(pool_bytes=pool_bytes) as agent:
        sources = {}
        conn.send(("ready", agent.tcp_address, os.getpid()))
        while True:
            cmd = conn.recv()
            if cmd[0] == "offer":
                src = agent.create_source(cmd[1], timeout_s=cmd[3])
                src.buffer[:] = payload(cmd[1], cmd[2])
                sources[src.transfer_id] = src
                conn.send(msgspec.msgpack.encode(src.publish()))
            elif cmd[0] == "stream":
                src = agent.create_source(cmd[1], timeout_s=cmd[3])
                sources[src.transfer_id] = src
                conn.send(msgspec.msgpack.encode(src.publish(ready=0)))
                src.buffer[: cmd[4]] = payload(cmd[1], cmd[2])[: cmd[4]]
                src.mark_ready(cmd[4])
                conn.send("written")
            elif cmd[0] == "status":
                src, deadline = sources[cmd[1]], time.monotonic() + cmd[2]
                while not src.poll().finished and time.monotonic() < deadline:
                    time.sleep(0.005)
                conn.send((src.poll().state.value, src.poll().reason))
            elif cmd[0] == "pull":
                desc = msgspec.msgpack.decode(cmd[1], type=TransferDescriptor)
                dst = agent.pull(desc, transport=cmd[2], timeout_s=10.0)
                dst.finished_event.wait(10.0)
                st = dst.poll()
                sha = digest(dst.payload) if st.state.value == "done" else ""
                if cmd[3]:
                    held.append(dst)
                else:
                    dst.release()
                conn.send((st.state.value, st.reason, sha))
            elif cmd[0] == "segments":
                conn.send(list_segments(os.getpid()))
            else:
                return


def stalled_source(conn: Connection, nbytes: int) -> None:
    """A TCP source that answers a pull with Ready(nbytes), sends half, then hangs."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn.send(f"127.0.0.1:{server.getsockname()[1]}")
        peer, _ = server.accept()
        fr.recv_frame(peer)
        fr.send_frame(peer, fr.Ready(nbytes))
        peer.sendall(bytes(nbytes // 2))
        conn.send("stalled")
        time.sleep(3600)


def stalled_dest(conn: Connection, address: str, transfer_id: str) -> None:
    """A TCP destination that asks for a payload, reads a little of it, then hangs."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    fr.send_frame(sock, fr.Pull(transfer_id))
    fr.recv_frame(sock)
    sock.recv(1024)
    conn.send("stalled")
    time.sleep(3600)


def direct_source(conn: Connection, num_blocks: int, block_size: int) -> None:
    """A prefill worker's side of the one copy: a shared mock cache whose block b holds b in
    every slot, published for blocks 1..num_blocks-1 with its region; obeys ("status",
    wait_s) like ``agent_peer`` and ("exit",)."""
    from interlock.engine.runners.mock import MockRunner

    runner = MockRunner(num_blocks=num_blocks, block_size=block_size, timing=None, shared=True)
    for b in range(num_blocks):
        runner.kv[b] = b
    with TransferAgent(pool_bytes=0) as agent:
        src = agent.create_source((num_blocks - 1) * runner.kv_block_nbytes, timeout_s=10.0)
        desc = src.publish(ready=0, cache_region=runner.shared_region())
        conn.send(msgspec.msgpack.encode(desc))
        while True:
            cmd = conn.recv()
            if cmd[0] == "status":
                deadline = time.monotonic() + cmd[1]
                while not src.poll().finished and time.monotonic() < deadline:
                    time.sleep(0.005)
                conn.send((src.claim_kind(), src.poll().state.value, src.poll().reason))
            else:
                return


def direct_dest(conn: Connection, descriptor: bytes) -> None:
    """Claims a transfer DIRECT, says so, then waits to be killed (a decode worker that dies
    mid-copy)."""
    desc = msgspec.msgpack.decode(descriptor, type=TransferDescriptor)
    with TransferAgent(pool_bytes=0) as agent:
        dst = agent.pull_direct(desc, timeout_s=30.0)
        conn.send((dst.poll().state.value, dst.poll().reason))
        time.sleep(3600)
