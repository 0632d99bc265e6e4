"""Source-side endings: aborts from either side, timeouts, unknown transfers; buffers freed."""

import os
import time

import pytest

from interlock.transfer import TransferAgent, TransferState

TRANSPORTS = ["inproc", "shm", "tcp"]


@pytest.fixture(scope="module")
def other():
    with TransferAgent(pool_bytes=0) as a:
        yield a


def _wait_end(transfer, wait_s: float = 5.0):
    deadline = time.monotonic() + wait_s
    while not transfer.poll().finished and time.monotonic() < deadline:
        time.sleep(0.002)
    return transfer.poll()


def _published(agent, nbytes=4096, timeout_s=10.0):
    src = agent.create_source(nbytes, timeout_s=timeout_s)
    src.buffer[:] = os.urandom(nbytes)
    return src, src.publish()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_source_abort_before_pull_fails_the_destination(agent, other, transport, own_segments):
    src, desc = _published(agent)
    src.abort()
    assert src.poll().reason == "aborted by source"
    assert own_segments() == []
    st = _wait_end(other.pull(desc, transport=transport, timeout_s=5))
    assert st.state is TransferState.FAILED
    assert st.reason


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destination_abort_after_done_fails_the_source(agent, other, transport, own_segments):
    src, desc = _published(agent)
    dst = other.pull(desc, transport=transport, timeout_s=5)
    assert _wait_end(dst).state is TransferState.DONE
    dst.abort()
    assert dst.poll().state is TransferState.FAILED
    with pytest.raises(RuntimeError):
        dst.payload  # noqa: B018
    # TCP hands the bytes over with the Ack, so the source is already DONE there.
    expected = TransferState.DONE if transport == "tcp" else TransferState.FAILED
    assert _wait_end(src).state is expected
    assert own_segments() == []


def test_published_source_times_out_without_being_polled(agent, own_segments):
    src, _ = _published(agent, timeout_s=0.2)
    time.sleep(0.6)  # the agent's housekeeping (tick 0.05 s) ends it, not our poll
    assert src._status.reason.startswith("timeout")
    assert own_segments() == []
    assert agent.num_live_sources() == 0


def test_unpublished_source_times_out_too(agent):
    src = agent.create_source(10, timeout_s=0.1)
    assert _wait_end(src).reason.startswith("timeout")
    with pytest.raises(RuntimeError):
        src.buffer  # noqa: B018


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pull_after_completion_is_refused(agent, other, transport):
    src, desc = _published(agent)
    first = other.pull(desc, transport="tcp", timeout_s=5)
    assert _wait_end(first).state is TransferState.DONE
    first.release()
    assert _wait_end(src).state is TransferState.DONE
    second = _wait_end(other.pull(desc, transport=transport, timeout_s=5))
    assert second.state is TransferState.FAILED


def test_second_claim_is_refused(agent, other):
    src, desc = _published(agent)
    first = other.pull(desc, transport="inproc")
    second = other.pull(desc, transport="inproc")
    assert second.poll().reason == "transfer already claimed"
    first.release()
    assert src.poll().state is TransferState.DONE


def test_publish_twice_or_after_abort(agent):
    src = agent.create_source(1)
    src.abort()
    with pytest.raises(RuntimeError):
        src.publish()


def test_an_export_still_running_when_the_transfer_is_aborted_writes_nowhere_harmful(
    agent, other, own_segments
):
    """A worker closing aborts its in-process pull while the prefill export still writes:
    the writer's view stays valid (no "operation forbidden on released memoryview"), the
    destination's too, and the segment is gone."""
    src = agent.create_source(4096, timeout_s=10.0)
    buf = src.buffer
    desc = src.publish(ready=0)
    dst = agent.pull(desc, transport="inproc")
    payload = dst.payload
    dst.abort("worker closing")
    assert src.poll().state is TransferState.FAILED
    buf[:10] = b"0123456789"  # the export's next chunk lands in pages nobody reads
    assert bytes(payload[:10]) == b"0123456789"
    assert own_segments() == []
