"""A disk KV tier on a real, tiny tmpfs that fills up (ENOSPC): no request fails, failed writes
are counted and leave nothing behind, and the tier keeps storing the blocks that fit.

Mounting needs root (CAP_SYS_ADMIN); elsewhere these tests skip, saying so."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlock import kvhash
from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.tiers import DiskTier, ManualIO
from interlock.engine.tiers.disk import block_name, block_path, read_block, write_block
from tests.engine.conftest import EOS, VOCAB, request, run_to_end, tokens

TMPFS_KIB = 256
BS = 1024
"""Tokens per block: a block file is 4 KiB of payload plus a header, two pages of the tmpfs,
so a write that runs out of space stops half-way (one page written)."""
NBYTES = BS * 4


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_KIB}k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # a file still open: detach


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".tmp")


def test_a_full_file_system_shrinks_the_tier_to_what_fits(tiny_disk: Path) -> None:
    io = ManualIO()
    tier = DiskTier(tiny_disk, 100, NBYTES, "mock", io)
    for h in range(1, 41):
        tier.put(h, bytes([h]) * NBYTES)
    io.run_pending()
    ready, failed = tier.poll()
    assert ready and failed and tier.write_failures == len(failed)
    assert len(ready) + len(failed) == 40 and tier.room == len(ready) < tier.capacity
    assert leftovers(tier.directory) == []  # half-written temporary files are gone
    assert {p.name for p in tier.directory.glob("*.kv")} == {block_name(h) for h in ready}
    # A write that fails half-way leaves nothing readable.
    with pytest.raises(OSError):
        write_block(tier.directory, 999, tier.layout, b"x" * NBYTES)
    assert not block_path(tier.directory, 999).exists() and leftovers(tier.directory) == []
    assert read_block(tier.directory, 999, tier.layout, NBYTES) is None
    # New blocks now take the place of the oldest ones, and fit.
    for h in range(41, 51):
        tier.put(h, bytes([h]) * NBYTES)
    io.run_pending()
    ready2, failed2 = tier.poll()
    assert ready2 == list(range(41, 51)) and failed2 == []
    assert all(read_block(*tier.reader(h)) == bytes([h]) * NBYTES for h in ready2)
    tier.check_integrity()
    tier.close()


def full_disk_engine(io: ManualIO, path: Path) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(runner="mock"),
        cache=CacheConfig(
            num_blocks=8,
            block_size=BS,
            watermark=0.0,
            disk_kv_blocks=200,  # far more than the 256 KiB tmpfs holds (about 31 blocks)
            disk_kv_path=str(path),
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=4, max_model_len=4096),
    )
    runner = MockRunner(num_blocks=8, block_size=BS, vocab_size=VOCAB, eos_token_ids=(EOS,), timing=None)
    return EngineCore(config, runner, clock=VirtualClock(), tier_io=io)


def long_prompt(seed: int) -> list[int]:
    return [(seed * 7919 + i * 13) % (VOCAB - 10) + 10 for i in range(2 * BS + 1)]


def test_a_disk_tier_that_fills_up_costs_no_request(tiny_disk: Path) -> None:
    io = ManualIO()
    engine = full_disk_engine(io, tiny_disk)
    tiers = engine.tiers
    assert tiers is not None and tiers.disk is not None
    disk = tiers.disk
    prompts = [long_prompt(s) for s in range(30)]
    full_at = None
    for i, p in enumerate(prompts):  # 2 full blocks each, spilled to disk as the pool turns over
        engine.add_request(request(f"p{i}", p, 2))
        outs = run_to_end(engine, each_step=lambda _: io.run_pending())
        assert tokens(outs[f"p{i}"]) == reference_output(p, 2, vocab_size=VOCAB)
        if full_at is None and disk.write_failures:
            full_at = i
    io.run_pending()
    engine.step()
    engine.check_integrity()
    stats = {s.tier: s for s in engine.load.kv_tiers}["disk"]
    assert full_at is not None and stats.write_failures == disk.write_failures > 0
    assert disk.room < disk.capacity and len(disk) <= disk.room
    # Nothing half-written is left, and every block file there is whole and indexed.
    assert leftovers(disk.directory) == []
    files = {p.name for p in disk.directory.glob("*.kv")}
    assert files == {block_name(h) for h in disk.hashes()}
    assert all(read_block(*disk.reader(h)) is not None for h in disk.hashes())

    # The tier kept storing blocks after the disk filled: a prompt run after that loads back.
    later = [
        p
        for p in prompts[full_at + 1 :]
        if engine.pool.get_cached_block(kvhash.hash_blocks(p, BS)[0]) is None
        and tiers.lookup(kvhash.hash_blocks(p, BS)) == 2
    ]
    assert len(later) >= 2
    engine.add_request(request("again", later[-1], 2))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["again"]) == reference_output(later[-1], 2, vocab_size=VOCAB)
    assert outs["again"][-1].num_cached_tokens == 2 * BS
    assert {s.tier: s for s in engine.load.kv_tiers}["disk"].loads == 2

    # A block torn on disk (as a crash mid-write would leave it) fails its check: computed.
    torn = later[0]
    path = block_path(disk.directory, kvhash.hash_blocks(torn, BS)[0])
    path.write_bytes(path.read_bytes()[: NBYTES // 2])
    assert read_block(*disk.reader(kvhash.hash_blocks(torn, BS)[0])) is None
    engine.add_request(request("torn", torn, 2))
    outs = run_to_end(engine, each_step=lambda _: io.run_pending())
    assert tokens(outs["torn"]) == reference_output(torn, 2, vocab_size=VOCAB)
    assert {s.tier: s for s in engine.load.kv_tiers}["disk"].load_failures == 1
    io.run_pending()
    engine.step()
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0 and disk.num_pinned == 0
    engine.close()
