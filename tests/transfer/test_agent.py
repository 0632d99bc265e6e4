"""Round trips over every transport, in one process and across two, plus concurrency."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock.errors import TransferError
from interlock.transfer import TransferAgent, TransferState
from tests.transfer.peers import digest, payload

SIZES = st.one_of(st.sampled_from([0, 1, 7, 4095, 4096, 4097, 65537]), st.integers(0, 3 << 20))
_settings = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _pull_and_check(agent, descriptor, transport, expected: bytes):
    dst = agent.pull(descriptor, transport=transport, timeout_s=10)
    assert dst.finished_event.wait(10)
    assert dst.poll().state is TransferState.DONE, dst.poll().reason
    assert dst.transport == transport
    assert bytes(dst.payload) == expected
    dst.release()
    dst.release()


def _source_end(src, wait_s: float = 5.0) -> TransferState:
    """The source learns of completion at once (inproc), on the Ack (tcp) or at its next poll (shm)."""
    deadline = time.monotonic() + wait_s
    while not src.poll().finished and time.monotonic() < deadline:
        time.sleep(0.002)
    return src.poll().state


@pytest.fixture(scope="module")
def other():
    with TransferAgent() as a:
        yield a


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
@given(nbytes=SIZES, seed=st.integers(0, 2**32))
@_settings
def test_round_trip_in_process(agent, other, transport, nbytes, seed):
    data = payload(nbytes, seed)
    src = agent.create_source(nbytes, timeout_s=10)
    src.buffer[:] = data
    _pull_and_check(other, src.publish(), transport, data)
    assert _source_end(src) is TransferState.DONE
    assert agent.num_live_sources() == 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@given(nbytes=SIZES, seed=st.integers(0, 2**32))
@_settings
def test_round_trip_from_another_process(agent, remote, transport, nbytes, seed):
    desc = remote.offer(nbytes, seed)
    assert agent.choose_transport(desc) == "shm"
    _pull_and_check(agent, desc, transport, payload(nbytes, seed))
    assert remote.call("status", desc.transfer_id, 5.0) == ("done", "")
    assert remote.call("segments") == []


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@given(nbytes=SIZES, seed=st.integers(0, 2**32))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_round_trip_to_another_process(agent, remote, transport, nbytes, seed, own_segments):
    import msgspec

    data = payload(nbytes, seed)
    src = agent.create_source(nbytes, timeout_s=10)
    src.buffer[:] = data
    desc = src.publish()
    assert remote.call("pull", msgspec.msgpack.encode(desc), transport, False) == ("done", "", digest(data))
    assert _source_end(src) is TransferState.DONE
    assert own_segments() == []


def test_transport_choice(agent, other):
    src = agent.create_source(1)
    desc = src.publish()
    assert agent.choose_transport(desc) == "inproc"
    assert other.choose_transport(desc) == "inproc"  # same process, other agent
    foreign = desc.__class__(**{**{f: getattr(desc, f) for f in desc.__struct_fields__}, "agent_id": "x"})
    assert agent.choose_transport(foreign) == "shm"
    remote_host = foreign.__class__(
        **{**{f: getattr(foreign, f) for f in foreign.__struct_fields__}, "host_id": "h"}
    )
    assert agent.choose_transport(remote_host) == "tcp"
    src.abort()


def test_private_staging_is_served_over_tcp(agent):
    with TransferAgent(use_shm=False) as private:
        src = private.create_source(100)
        src.buffer[:] = bytes(range(100))
        desc = src.publish()
        assert desc.shm_name == ""
        foreign = desc.__class__(**{**{f: getattr(desc, f) for f in desc.__struct_fields__}, "agent_id": "x"})
        assert agent.choose_transport(foreign) == "tcp"
        _pull_and_check(agent, foreign, "tcp", bytes(range(100)))


@pytest.mark.parametrize("transport", ["inproc", "shm", "tcp"])
def test_concurrent_transfers(agent, other, transport, own_segments):
    blobs = [payload(100_000 + i * 4099, i) for i in range(12)]
    sources = [agent.create_source(len(b), timeout_s=10) for b in blobs]
    descs = []
    for src, blob in zip(sources, blobs, strict=True):
        src.buffer[:] = blob
        descs.append(src.publish())
    dests = [other.pull(d, transport=transport, timeout_s=10) for d in descs]
    for dst, blob in zip(dests, blobs, strict=True):
        assert dst.finished_event.wait(10)
        assert bytes(dst.payload) == blob
        dst.release()
    assert all(_source_end(s) is TransferState.DONE for s in sources)
    assert own_segments() == []


def test_closed_agent_aborts_sources_and_refuses_new_ones():
    a = TransferAgent()
    src = a.create_source(10)
    src.publish()
    a.close()
    assert src.poll().reason == "transfer agent closed"
    with pytest.raises(TransferError):
        a.create_source(1)
    a.close()
