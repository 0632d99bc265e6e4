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
