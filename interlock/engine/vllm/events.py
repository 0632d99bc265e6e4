"""vLLM's KV events into Interlock's: the router's block hashes, a mirror for re-syncs, and
sequence checks. Pure (no sockets, no vLLM import): the adapter feeds it decoded batches.

Hashes: recomputed, not mapped. vLLM's block hash depends on its hash function, its seed and
extra keys the router never sees; Interlock's router hashes a request's tokens with
``interlock.kvhash``. A ``BlockStored`` carries the stored blocks' token ids and the parent's
vLLM hash, so the translator keeps ``vLLM hash -> our hash`` for every block vLLM holds and
chains ``kvhash.hash_block`` from the parent's hash: the router then matches vLLM's blocks with
the hashes it already computes, and nothing above the worker knows vLLM's hash function.
Blocks whose hash covers more than tokens (a LoRA adapter, multimodal or salt ``extra_keys``)
are not announced: a plain-token hash would claim a prefix they do not hold for other requests.
A block whose parent is unknown (events lost) cannot be chained and is not announced either.

Sequence numbers: vLLM numbers its batches from 0, +1 each. A batch past the next expected one
is a gap (``Gap``): the adapter asks vLLM's replay socket for the missing ones and feeds them
in order; when it cannot, ``reset`` forgets everything (the router is told ``AllBlocksCleared``;
vLLM's blocks announced again as they are stored again). A batch numbered 0 after others is a
restarted publisher (a new engine process): the mirror is cleared the same way.

Mirror: every announced block (our hash -> parent) in store order, so a router's
re-sync gets a snapshot without asking vLLM, which has no such call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.kvhash import ROOT_PARENT, hash_block, hash_blocks
from interlock.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

_TIERS = {None: "device", "GPU": "device", "CPU": "host"}
"""vLLM's ``medium`` per tier (its device cache is "GPU" on every platform, the CPU build too);
anything else (storage) is the disk tier."""


@dataclass(frozen=True)
class Gap:
    """Batches ``first`` .. ``upto - 1`` were missed."""

    first: int
    upto: int


@dataclass
class _Block:
    ours: int
    parent: int
    tier: str


@dataclass
class Translator:
    block_size: int
    next_seq: int = 0
    skipped: int = 0
    """Blocks not announced (extra keys, unknown parent, another block size)."""
    resets: int = 0
    _blocks: dict[tuple[str, int], _Block] = field(default_factory=dict)
    """(tier, vLLM hash) -> the block, in store order."""
    _on_device: dict[int, int] = field(default_factory=dict)
    """Our hash -> how many device-tier entries carry it (vLLM may hold a block twice)."""

    def check(self, seq: int) -> Gap | None:
        """Where batch ``seq`` stands: None when it is the next one, or a restart (then the
        mirror is already cleared and ``AllBlocksCleared`` is the first event of ``feed``)."""
        if seq == self.next_seq:
            return None
        if seq < self.next_seq:
            if seq == 0:  # a new publisher: a new engine process and an empty cache
                return None
            raise ValueError(f"batch {seq} arrived after {self.next_seq - 1}")
        return Gap(self.next_seq, seq)

    def feed(self, seq: int, events: list[dict[str, Any]]) -> list[KVEvent]:
        """Interlock's events for vLLM's batch ``seq`` (decoded msgpack maps), which ``check``
        said is in order."""
        out: list[KVEvent] = []
        if seq == 0 and self.next_seq > 0:
            out += self.reset()
        self.next_seq = seq + 1
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                out += self._stored(event)
            elif kind == "BlockRemoved":
                out += self._removed(event)
            elif kind == "AllBlocksCleared":
                self._blocks.clear()
                self._on_device.clear()
                out.append(AllBlocksCleared())
        return out

    def reset(self, next_seq: int | None = None) -> list[KVEvent]:
        """Forget every block (events were lost for good); continue at ``next_seq``."""
        self._blocks.clear()
        self._on_device.clear()
        self.resets += 1
        if next_seq is not None:
            self.next_seq = next_seq
        return [AllBlocksCleared()]

    def snapshot(self) -> list[KVEvent]:
        """The mirror as a re-sync's events: ``AllBlocksCleared``, then each block after its
        parent (store order)."""
        events: list[KVEvent] = [AllBlocksCleared()]
        return events + [
            BlockStored(
                block_hashes=(b.ours,),
                parent_block_hash=b.parent if b.parent != ROOT_PARENT else None,
                block_size=self.block_size,
                tier=b.tier,
            )
            for b in self._blocks.values()
        ]

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of the prompt's prefix held in vLLM's device cache, as its events said."""
        n = 0
        for h in hash_blocks(token_ids, self.block_size):
            if h not in self._on_device:
                break
            n += self.block_size
        return n

    def _put(self, key: tuple[str, Any], block: _Block) -> None:
        old = self._blocks.pop(key, None)
        if old is not None:
            self._drop_device(old)
        self._blocks[key] = block
        if block.tier == "device":
            self._on_device[block.ours] = self._on_device.get(block.ours, 0) + 1

    def _drop_device(self, block: _Block) -> None:
        if block.tier == "device":
            left = self._on_device.get(block.ours, 0) - 1
            if left > 0:
                self._on_device[block.ours] = left
            else:
                self._on_device.pop(block.ours, None)

    def _stored(self, e: dict[str, Any]) -> list[KVEvent]:
        hashes = list(e.get("block_hashes") or ())
        tier = _TIERS.get(e.get("medium"), "disk")
        extra = e.get("extra_keys") or ()
        plain = e.get("lora_id") is None and e.get("lora_name") is None and not any(extra)
        tokens = list(e.get("token_ids") or ())
        parent_v = e.get("parent_block_hash")
        if parent_v is None:
            parent = ROOT_PARENT
        else:
            known = self._blocks.get((tier, _key(parent_v))) or self._any_tier(_key(parent_v))
            parent = known.ours if known is not None else -1
        if (
            not plain
            or parent < 0
            or e.get("block_size") != self.block_size
            or len(tokens) != len(hashes) * self.block_size
        ):
            self.skipped += len(hashes)
            return []
        ours: list[int] = []
        first_parent = parent
        for i, h in enumerate(hashes):
            block = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            mine = hash_block(parent, block)
            self._put((tier, _key(h)), _Block(mine, parent, tier))
            ours.append(mine)
            parent = mine
        return [
            BlockStored(
                block_hashes=tuple(ours),
                parent_block_hash=first_parent if first_parent != ROOT_PARENT else None,
                block_size=self.block_size,
                tier=tier,
            )
        ]

    def _removed(self, e: dict[str, Any]) -> list[KVEvent]:
        tier = _TIERS.get(e.get("medium"), "disk")
        gone = [
            b
            for h in e.get("block_hashes") or ()
            if (b := self._blocks.pop((tier, _key(h)), None)) is not None
        ]
        for b in gone:
            self._drop_device(b)
        ours = tuple(b.ours for b in gone)
        return [BlockRemoved(block_hashes=ours, tier=tier)] if ours else []

    def _any_tier(self, key: int) -> _Block | None:
        for tier in ("device", "host", "disk"):
            if (b := self._blocks.get((tier, key))) is not None:
                return b
        return None


def _key(h: Any) -> Any:
    """vLLM's external block hash: an int, or bytes for some hash functions (hashable either way)."""
    return bytes(h) if isinstance(h, (bytearray, memoryview, list)) else h
