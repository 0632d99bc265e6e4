"""Property test: random requests, steps, copies finishing in any order and aborts keep every
tier consistent, leak no block and never serve a block with the wrong content.

The mock runner's KV of a block is the token ids it was computed from, and a block's hash names
those tokens, so every block anywhere (device pool, host slot, disk file) can be checked
against the tokens its hash stands for; and every finished request's output must equal the
mock model's reference output, whatever tier its prefix came from.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from functools import partial
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from interlock import kvhash
from interlock.engine.runners.mock import MockRunner, reference_output
from interlock.engine.tiers import ManualIO
from interlock.engine.tiers.disk import read_block
from interlock.engine.tiers.shared import WRITING, SharedHostTier, segment_path
from interlock.protocol import BlockStored
from tests.engine.conftest import VOCAB, request
from tests.engine.tiers.test_engine_tiers import BS, tiered_engine

PREFIXES = [[(p * 37 + i * 11) % 900 + 10 for i in range(24)] for p in range(4)]


class TiersMachine(RuleBasedStateMachine):
    shared: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="kvtiers-"))
        self.io = ManualIO()
        self.engine = tiered_engine(
            self.io, num_blocks=10, host=5, disk=8, path=self.dir, shared=self.new_segment()
        )
        self.runner = self.engine.runner
        assert isinstance(self.runner, MockRunner)
        self.tokens_of: dict[int, tuple[int, ...]] = {}
        self.prompts: dict[str, list[int]] = {}
        self.max_tokens: dict[str, int] = {}
        self.out: dict[str, list[int]] = {}
        self.aborted: set[str] = set()
        self.n = 0

    @initialize()
    def fill_the_tiers(self) -> None:
        """Every prefix once, to the end: the later requests find them in every tier."""
        for p in range(len(PREFIXES)):
            self.add(p, 24, [], 1)
            for _ in range(10):
                self.step(1)
                self.io.run_pending()

    @rule(
        p=st.integers(0, 3),
        cut=st.integers(8, 24),
        tail=st.lists(st.integers(10, 900), max_size=6),
        max_tokens=st.integers(1, 5),
    )
    def add(self, p: int, cut: int, tail: list[int], max_tokens: int) -> None:
        self.n += 1
        rid = f"r{self.n}"
        prompt = PREFIXES[p][:cut] + tail
        self.prompts[rid], self.max_tokens[rid], self.out[rid] = prompt, max_tokens, []
        self.engine.add_request(request(rid, prompt, max_tokens))

    @rule(steps=st.integers(1, 12))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            res = self.engine.step()
            for o in res.outputs:
                assert o.error is None, o.error
                self.out[o.request_id] += o.token_ids
            for ev in res.kv_events:  # events carry hashes: a block's tokens are its sequence's
                if isinstance(ev, BlockStored) and ev.tier == "device":
                    for h in ev.block_hashes:
                        if h not in self.tokens_of:
                            self._learn_blocks()
                        assert h in self.tokens_of, "a stored block no sequence has"
            for o in res.outputs:
                if o.finish_reason == "length":
                    want = reference_output(
                        self.prompts[o.request_id], self.max_tokens[o.request_id], vocab_size=VOCAB
                    )
                    assert self.out[o.request_id] == want, o.request_id

    def _learn_blocks(self) -> None:
        """Every full block of every sequence so far, by its hash."""
        for rid, prompt in self.prompts.items():
            seq = [*prompt, *self.out[rid]]
            for i, h in enumerate(kvhash.hash_blocks(seq, BS)):
                self.tokens_of[h] = tuple(seq[i * BS : (i + 1) * BS])

    @rule(n=st.integers(0, 3))
    def run_io(self, n: int) -> None:
        self.io.run_pending(n)

    @rule(i=st.integers(0, 50))
    def abort(self, i: int) -> None:
        live = sorted(self.engine.scheduler.requests)
        if live:
            rid = live[i % len(live)]
            self.engine.abort(rid)
            self.aborted.add(rid)

    @invariant()
    def consistent(self) -> None:
        self.engine.check_integrity()

    @invariant()
    def right_content_everywhere(self) -> None:
        pool, kv = self.engine.pool, self.runner.kv
        for b, h in enumerate(pool.block_hash):
            if h is not None and h in self.tokens_of:
                assert tuple(kv[b]) == self.tokens_of[h], f"device block {b}"
        tiers = self.engine.tiers
        assert tiers is not None and tiers.host is not None and tiers.disk is not None
        got: dict[int, tuple[int, ...]] = {}
        for h in tiers.host.hashes():
            handle = tiers.host.acquire(h)
            assert handle is not None
            if tiers.host.read(handle, partial(_keep, got, h)):  # a shared slot may change: discarded
                assert got[h] == self.tokens_of[h], "host slot"
            tiers.host.release(handle)
        for h in tiers.disk.hashes():
            data = read_block(*tiers.disk.reader(h))
            if data is not None:  # a deletion may be queued behind a read: gone is fine, wrong is not
                assert tuple(np.frombuffer(data, dtype=np.int32)) == self.tokens_of[h], "disk file"

    def teardown(self) -> None:
        try:
            for _ in range(500):
                if not self.engine.has_unfinished() and not self.engine.tiers.has_pending():  # type: ignore[union-attr]
                    break
                self.io.run_pending()
                self.step(1)
            assert not self.engine.has_unfinished()
            self.io.run_pending()
            self.engine.step()
            self.engine.check_integrity()
            assert self.engine.pool.num_used_blocks == 0, "blocks leaked"
            assert not self.engine.scheduler.orphans
            for rid in self.prompts:
                if rid not in self.aborted:
                    assert len(self.out[rid]) == self.max_tokens[rid], rid
        finally:
            self.engine.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.shared is not None:
                for suffix in ("", ".lock"):
                    Path(str(segment_path(self.shared)) + suffix).unlink(missing_ok=True)

    def new_segment(self) -> str | None:
        return None


class SharedTiersMachine(TiersMachine):
    """The same over a shared host tier (written through), where other workers die mid-write."""

    def new_segment(self) -> str | None:
        self.shared = f"test-machine-{uuid.uuid4().hex[:12]}"
        return self.shared

    @rule(slot=st.integers(0, 4), h=st.integers(1, 2**63))
    def another_worker_dies_mid_write(self, slot: int, h: int) -> None:
        host = self.engine.tiers.host  # type: ignore[union-attr]
        assert isinstance(host, SharedHostTier)
        t = host._table
        with host._locked():
            if t["state"][slot] != WRITING:
                t["seq"][slot] += 1 if t["seq"][slot] % 2 == 0 else 2
                t["hash"][slot], t["pid"][slot], t["state"][slot] = h, DEAD_PID, WRITING
                host._changed()


def _keep(into: dict[int, tuple[int, ...]], h: int, mv: memoryview) -> None:
    into[h] = tuple(np.frombuffer(mv, dtype=np.int32))


TiersMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestTiersMachine = TiersMachine.TestCase
SharedTiersMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
TestSharedTiersMachine = SharedTiersMachine.TestCase


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


DEAD_PID = _dead_pid()
