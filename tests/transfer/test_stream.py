"""Streamed payloads: the destination imports each chunk once the source marks it ready, the
result is the sequential path's, and a source that stops mid-payload or a recycled buffer
never yields a payload taken for complete."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest

from interlock.engine.runners.mock import MockRunner
from interlock.protocol.transfer import TransferDescriptor
from interlock.transfer import (
    BlockImport,
    TransferAgent,
    TransferState,
    import_when_done,
    publish_blocks,
    stage_blocks,
)
from interlock.transfer import staging as stg
from interlock.transfer.staging import list_segments
from tests.transfer import peers

NUM_BLOCKS = 64
CHUNK_BLOCKS = 5


@pytest.fixture(scope="module")
def other():
    with TransferAgent() as a:
        yield a


def _runners(seed: int) -> tuple[MockRunner, MockRunner, list[int], list[int]]:
    prefill = MockRunner(num_blocks=NUM_BLOCKS, timing=None)
    decode = MockRunner(num_blocks=NUM_BLOCKS, timing=None)
    rng = np.random.default_rng(seed)
    prefill.kv[:] = rng.integers(0, 1 << 30, prefill.kv.shape, dtype=np.int32)
    n = 37  # not a multiple of the chunk
    src_ids = [int(b) for b in rng.permutation(NUM_BLOCKS)[:n]]
    dst_ids = [int(b) for b in rng.permutation(NUM_BLOCKS)[:n]]
    return prefill, decode, src_ids, dst_ids


def _wait(cond, wait_s: float = 10.0) -> None:
    deadline = time.monotonic() + wait_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


@pytest.mark.parametrize("transport", ["inproc", "shm"])
def test_chunks_are_imported_in_order_as_they_become_ready(agent, other, transport):
    prefill, decode, src_ids, dst_ids = _runners(seed=1)
    chunk = CHUNK_BLOCKS * prefill.kv_block_nbytes
    _src, desc, export = publish_blocks(agent, prefill, src_ids, timeout_s=10, chunk_bytes=chunk)
    dst = other.pull(desc, transport=transport, timeout_s=10)
    imp = BlockImport(dst, decode, dst_ids)
    assert imp.step().state is TransferState.PENDING and imp.imported == 0  # nothing ready yet
    more = True
    while more:
        more = export.step()
        status = imp.step()
        k = export.exported
        assert imp.imported == k  # exactly the blocks marked ready, no more
        assert (decode.kv[dst_ids[:k]] == prefill.kv[src_ids[:k]]).all()
        assert (decode.kv[dst_ids[k:]] == -1).all()  # nothing past the ready mark was touched
        assert status.state is (TransferState.DONE if not more else TransferState.PENDING)
    assert export.exported == len(src_ids)


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
def test_streamed_result_equals_the_sequential_path(agent, other, transport):
    prefill, streamed, src_ids, dst_ids = _runners(seed=2)
    sequential = MockRunner(num_blocks=NUM_BLOCKS, timing=None)
    _src, desc = stage_blocks(agent, prefill, src_ids, timeout_s=10)
    dst = other.pull(desc, transport=transport, timeout_s=10)
    _wait(lambda: dst.poll().finished)
    assert import_when_done(dst, sequential, dst_ids).state is TransferState.DONE

    chunk = CHUNK_BLOCKS * prefill.kv_block_nbytes
    _src, desc, export = publish_blocks(agent, prefill, src_ids, timeout_s=10, chunk_bytes=chunk)
    dst = other.pull(desc, transport=transport, timeout_s=10)
    imp = BlockImport(dst, streamed, dst_ids)
    progress = []
    while export.step():
        imp.step()
        progress.append(imp.imported)
    assert imp.wait(10).state is TransferState.DONE
    assert progress == sorted(progress)
    assert (streamed.kv == sequential.kv).all()
    assert (streamed.kv[dst_ids] == prefill.kv[src_ids]).all()


def test_tcp_sends_each_chunk_once_it_is_ready(agent, other):
    prefill, decode, src_ids, dst_ids = _runners(seed=3)
    chunk = CHUNK_BLOCKS * prefill.kv_block_nbytes
    src, desc, export = publish_blocks(agent, prefill, src_ids, timeout_s=10, chunk_bytes=chunk)
    dst = other.pull(desc, transport="tcp", timeout_s=10)
    imp = BlockImport(dst, decode, dst_ids)
    export.step()
    _wait(lambda: imp.step() is not None and imp.imported == CHUNK_BLOCKS)
    assert src.poll().state is TransferState.PENDING and dst.progress() == chunk  # the rest unwritten
    export.run()
    assert imp.wait(10).state is TransferState.DONE
    assert (decode.kv[dst_ids] == prefill.kv[src_ids]).all()
    _wait(lambda: src.poll().finished)
    assert src.poll().state is TransferState.DONE


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
def test_source_that_stops_mid_payload_fails_the_pull_by_timeout(agent, other, transport):
    prefill, decode, src_ids, dst_ids = _runners(seed=4)
    chunk = CHUNK_BLOCKS * prefill.kv_block_nbytes
    src, desc, export = publish_blocks(agent, prefill, src_ids, timeout_s=10, chunk_bytes=chunk)
    export.step()  # one chunk out, then the source stalls
    dst = other.pull(desc, transport=transport, timeout_s=0.3)
    imp = BlockImport(dst, decode, dst_ids)
    status = imp.wait(10)
    assert status.state is TransferState.FAILED
    assert status.reason == f"timeout after 0.3 s with {chunk} of {desc.nbytes} bytes"
    assert imp.imported <= CHUNK_BLOCKS  # never more than was ready, never taken for complete
    with pytest.raises(RuntimeError):
        dst.payload  # noqa: B018 - a failed pull has no payload
    _wait(lambda: src.poll().finished)  # the source learns (shm: header, tcp: socket) and frees
    assert src.poll().state is TransferState.FAILED
    assert export.step() is False


def test_source_killed_mid_stream_fails_the_shm_pull_before_the_timeout(spawn, agent):
    peer = spawn(peers.agent_peer)
    assert peer.recv()[0] == "ready"
    peer.conn.send(("stream", 1 << 20, 5, 30.0, 1 << 18))
    desc = msgspec.msgpack.decode(peer.recv(), type=TransferDescriptor)
    assert peer.recv() == "written"
    dst = agent.pull(desc, transport="shm", timeout_s=30)
    _wait(lambda: dst.poll() is not None and dst.progress() == 1 << 18)
    assert dst.poll().state is TransferState.PENDING
    assert bytes(dst.payload[: 1 << 18]) == peers.payload(1 << 20, 5)[: 1 << 18]
    peer.kill()
    t0 = time.monotonic()
    _wait(lambda: dst.poll().finished)
    assert time.monotonic() - t0 < 5
    assert dst.poll().state is TransferState.FAILED and dst.poll().reason == "source process died"
    TransferAgent().close()  # any agent's start sweeps the dead source's segment
    assert list_segments(peer.pid) == []


def test_source_abort_mid_stream_fails_the_pull(agent, other):
    prefill, decode, src_ids, dst_ids = _runners(seed=6)
    src, desc, export = publish_blocks(agent, prefill, src_ids, timeout_s=10, chunk_bytes=64)
    export.step()
    dst = other.pull(desc, transport="shm", timeout_s=10)
    src.abort("export failed")
    status = BlockImport(dst, decode, dst_ids).wait(10)
    assert (status.state, status.reason) == (TransferState.FAILED, "aborted by source")


def test_a_recycled_buffer_never_serves_the_old_bytes_as_new(other):
    with TransferAgent(pool_bytes=1 << 20) as agent:
        old = agent.create_source(100_000, timeout_s=10)
        old.buffer[:] = peers.payload(100_000, 7)
        old_desc = old.publish()
        dst = other.pull(old_desc, transport="shm", timeout_s=10)
        assert dst.poll().state is TransferState.DONE
        dst.release()
        _wait(lambda: old.poll().finished)

        new = agent.create_source(100_000, timeout_s=10)  # the same buffer, a new use
        new_desc = new.publish(ready=0)
        assert new_desc.shm_name == old_desc.shm_name and new_desc.shm_generation != old_desc.shm_generation
        # The old descriptor does not reach the new use, whose count starts again at zero.
        again = other.pull(old_desc, transport="shm", timeout_s=10)
        assert again.poll().reason == "transfer no longer staged (buffer reused)"
        fresh = other.pull(new_desc, transport="shm", timeout_s=0.2)
        assert fresh.poll().state is TransferState.PENDING and fresh.progress() == 0
        new.buffer[:50_000] = peers.payload(100_000, 8)[:50_000]
        new.mark_ready(50_000)
        fresh.poll()
        assert fresh.progress() == 50_000
        new.buffer[50_000:] = peers.payload(100_000, 8)[50_000:]
        new.mark_ready(100_000)
        assert fresh.poll().state is TransferState.DONE
        assert bytes(fresh.payload) == peers.payload(100_000, 8)
        fresh.release()


def test_prepare_zeroes_the_count_before_the_new_generation():
    st = stg.Staging.create(4096, shared=True)
    try:
        gen = st.prepare(4096)
        st.set_ready(4096)
        reader = stg.Staging.attach(st.name)
        gen2 = st.prepare(4096)
        # A reader still holding the old generation reads a count, then checks the generation.
        assert reader.ready() == 0 and not reader.is_use(4096, gen) and reader.is_use(4096, gen2)
        assert stg.READY_OFFSET % 8 == 0 and stg.READY_OFFSET >= 40  # one aligned word, its own
        reader.release(unlink=False)
    finally:
        st.release()


def test_marks_are_checked(agent):
    src = agent.create_source(100, timeout_s=10)
    with pytest.raises(RuntimeError, match="not published"):
        src.mark_ready(10)
    src.publish(ready=40)
    with pytest.raises(ValueError, match="outside"):
        src.mark_ready(20)  # never backwards
    with pytest.raises(ValueError, match="outside"):
        src.mark_ready(101)
    with pytest.raises(RuntimeError, match="already published"):
        src.publish()
    src.mark_ready(100)
    with pytest.raises(RuntimeError, match="complete"):
        src.buffer  # noqa: B018
    src.abort()
