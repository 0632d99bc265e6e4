"""The one copy's claim (``DirectDest``): a destination that copies straight from the source's
shared cache claims the transfer DIRECT in the staging header; the source then exports nothing
and holds its blocks until DONE, an abort, its timeout or the destination's death, and the
destination keeps its copy only if the source still held the blocks after it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import msgspec
import numpy as np
import pytest

from interlock.engine.runners.mock import MockRunner
from interlock.engine.shared_cache import SharedCacheView
from interlock.protocol.transfer import SharedCacheRegion, TransferDescriptor
from interlock.transfer import TransferAgent, TransferState
from interlock.transfer.dest import DirectDest
from interlock.transfer.source import Source
from tests.transfer import peers
from tests.transfer.conftest import Peer

BLOCKS, BLOCK_SIZE = 8, 4


@pytest.fixture(scope="module")
def region() -> Iterator[SharedCacheRegion]:
    runner = MockRunner(num_blocks=BLOCKS, block_size=BLOCK_SIZE, timing=None, shared=True)
    region = runner.shared_region()
    assert region is not None
    yield region  # while the runner (its memfd) lives


def _offer(
    agent: TransferAgent, region: SharedCacheRegion | None, timeout_s: float = 10.0
) -> tuple[Source, TransferDescriptor]:
    src = agent.create_source(64, timeout_s=timeout_s)
    assert isinstance(src, Source)
    return src, src.publish(ready=0, cache_region=region)


def test_a_direct_claim_holds_the_source_until_done(agent: TransferAgent, region: SharedCacheRegion) -> None:
    src, desc = _offer(agent, region)
    assert desc.cache_region == region and src.claim_kind() == ""
    dst = agent.pull_direct(desc)
    assert dst.transport == "direct" and dst.poll().state is TransferState.PENDING
    assert src.claim_kind() == "direct" and dst.progress() == 0
    assert agent.pull(desc, transport="shm").poll().reason == "transfer already claimed"
    assert src.poll().state is TransferState.PENDING  # held: nothing exported, nothing ended
    assert dst.holding()
    dst.release()
    assert dst.poll().state is TransferState.DONE
    assert src.poll().state is TransferState.DONE


def test_the_claim_is_known_after_the_transfer_ended_and_its_staging_serves_another(
    agent: TransferAgent, region: SharedCacheRegion
) -> None:
    """A destination may copy and say DONE before the source first asks how it was claimed;
    the answer then must not come from the staging, which the pool hands to the next one."""
    src, desc = _offer(agent, region)
    agent.pull_direct(desc).release()
    assert src.poll().state is TransferState.DONE  # its staging goes back to the pool
    other, other_desc = _offer(agent, None)
    agent.pull(other_desc, transport="shm")  # staged, maybe in the same staging
    assert src.claim_kind() == "direct" and other.claim_kind() == "staged"
    other.abort()
    src2, _ = _offer(agent, region)
    src2.abort()
    assert src2.claim_kind() == ""  # ended unclaimed


def test_a_staged_claim_is_told_apart(agent: TransferAgent, region: SharedCacheRegion) -> None:
    src, desc = _offer(agent, region)
    dst = agent.pull(desc, transport="shm")
    assert src.claim_kind() == "staged"
    dst.abort()
    src, desc = _offer(agent, region)
    agent.pull(desc, transport="inproc")
    assert src.claim_kind() == "staged"
    src.abort()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: msgspec.structs.replace(d, host_id="elsewhere"), "source on another host"),
        (lambda d: msgspec.structs.replace(d, cache_region=None), "offers no shared cache"),
    ],
)
def test_a_direct_claim_that_cannot_be_made_is_refused_and_claims_nothing(
    agent: TransferAgent,
    region: SharedCacheRegion,
    change: Callable[[TransferDescriptor], TransferDescriptor],
    why: str,
) -> None:
    src, desc = _offer(agent, region)
    dst = agent.pull_direct(change(desc))
    assert dst.poll().state is TransferState.FAILED and why in dst.poll().reason
    assert src.claim_kind() == ""  # the staged pull is still open to it
    src.abort()


def test_a_forced_transport_takes_no_direct_claim(region: SharedCacheRegion) -> None:
    with TransferAgent(pool_bytes=0, transport="shm") as forced:
        src, desc = _offer(forced, region)
        assert "forced transport shm" in forced.pull_direct(desc).poll().reason
        src.abort()


def test_a_source_without_a_shm_header_offers_no_direct_claim(region: SharedCacheRegion) -> None:
    with TransferAgent(pool_bytes=0, use_shm=False) as private:
        _, desc = _offer(private, region)
        assert desc.cache_region is None and not desc.shm_name


@pytest.mark.parametrize("end", ["timeout", "abort"])
def test_a_source_that_lets_go_of_its_blocks_is_seen_after_the_copy(
    agent: TransferAgent, region: SharedCacheRegion, end: str
) -> None:
    src, desc = _offer(agent, region, timeout_s=0.05 if end == "timeout" else 10.0)
    dst = agent.pull_direct(desc)
    assert dst.poll().state is TransferState.PENDING
    if end == "abort":
        src.abort()
    else:
        time.sleep(0.1)
        assert src.poll().state is TransferState.FAILED  # its timeout: it frees the blocks
    assert not dst.holding()  # so the copy made meanwhile is thrown away
    dst.release()  # a no-op on a failed pull
    assert dst.poll().state is TransferState.FAILED


def test_a_destination_killed_after_its_claim_frees_the_source(
    agent: TransferAgent, region: SharedCacheRegion, spawn: Callable[..., Peer]
) -> None:
    src, desc = _offer(agent, region)
    peer = spawn(peers.direct_dest, msgspec.msgpack.encode(desc))
    assert peer.recv() == ("pending", "")
    assert src.claim_kind() == "direct"
    peer.kill()
    deadline = time.monotonic() + 5.0
    while not src.poll().finished and time.monotonic() < deadline:
        time.sleep(0.01)
    assert src.poll().state is TransferState.FAILED and src.poll().reason == "destination process died"


def test_a_source_killed_after_the_claim_leaves_a_copy_of_what_it_held(
    agent: TransferAgent, spawn: Callable[..., Peer]
) -> None:
    peer = spawn(peers.direct_source, BLOCKS, BLOCK_SIZE)
    desc = msgspec.msgpack.decode(peer.recv(), type=TransferDescriptor)
    assert desc.cache_region is not None
    view = SharedCacheView(desc.cache_region)  # mapped before the claim, as the engine does
    dst = agent.pull_direct(desc)
    assert isinstance(dst, DirectDest) and peer.call("status", 0.0)[0] == "direct"
    peer.kill()
    mine = MockRunner(num_blocks=BLOCKS, block_size=BLOCK_SIZE, timing=None)
    src_ids = list(range(1, BLOCKS))
    mine.copy_from_shared(view, src_ids, list(reversed(src_ids)))
    assert dst.holding()  # it never let go: what it held is what was copied
    dst.release()
    assert [int(mine.kv[b][0]) for b in range(1, BLOCKS)] == list(reversed(src_ids))
    assert np.array_equal(mine.kv[1:].min(axis=1), mine.kv[1:].max(axis=1))
    view.close()


@pytest.mark.parametrize("seed", range(24))
def test_random_ends_never_keep_a_copy_of_blocks_the_source_let_go(
    agent: TransferAgent, region: SharedCacheRegion, seed: int
) -> None:
    """Random interleavings of a source abort, a destination abort, the source's timeout and
    the engine's copy step (``holding`` then ``release``, or ``abort``): a copy is kept only if
    the source had not let go when it was checked, and every transfer ends on both sides with
    its source gone from the agent (its blocks freed by the handoff)."""
    rng = random.Random(seed)
    src, desc = _offer(agent, region, timeout_s=rng.choice([0.03, 10.0]))
    dst = agent.pull_direct(desc)
    kept = None
    for op in rng.sample(["src_abort", "dst_abort", "wait", "copy"], k=rng.randint(1, 4)):
        if op == "src_abort":
            src.abort()
        elif op == "dst_abort":
            dst.abort()
        elif op == "wait":
            time.sleep(0.05)
        elif kept is None:  # the engine's copy step, once
            let_go = src.poll().state is TransferState.FAILED
            kept = dst.holding()
            assert not (kept and let_go)
            dst.release() if kept else dst.abort()
    if not src.poll().finished and kept is None:
        dst.abort()  # the request went away
    deadline = time.monotonic() + 5.0
    while not src.poll().finished and time.monotonic() < deadline:
        time.sleep(0.005)
    assert src.poll().finished and dst.poll().finished
    if src.poll().state is TransferState.DONE:  # (a kept copy may still see the source end
        assert kept  # otherwise: it aborted or timed out after the check, which is fine)
    assert agent._lookup(src.transfer_id) is None
