"""A frontend that keeps no KV index of its own (``ServiceOptions.kv_index="remote"``,
``interlock frontend --kv-index remote``) asks a router replica that does, once per request:
which workers hold a prefix of its blocks (``protocol/kv_sync.py``, ``KV_LOOKUP_ENDPOINT``).

So several frontends share one ingestion of the fleet's KV events: the replicas with an index
(``local``, the default) decode and apply every event; the ``remote`` ones subscribe to none and
pay one lookup round trip per request instead.

- ``RemoteChain``: a request's block hashes with the answer attached. It goes wherever the
  hashes go (the router's queue too), so a request decided later is decided on the same answer.
- ``KvLookup``: that answer as per-slot vectors for one decision (``lookup_of``); the deciders
  use it in place of their index's lookup (``router/kv_decide.py``, ``route_kernel.py``).
- ``KvLookupServer``: the endpoint, answered from a replica's routers.
- ``KvLookupClient``: asks the known replicas in turn, bounded in time. No replica, or no answer
  in time, leaves the plain hashes: the request is placed by load (and the router's own
  predictions of what it routed), as while a worker's state loads. Where the index is sharded
  (``router/shards.py``) and no replica keeps it whole, it asks one replica of every shard at
  once and joins their answers, each shard's for its own workers only; a shard that does not
  answer leaves its workers' prefixes unknown, the rest still count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np

from interlock.protocol.kv_sync import KvLookupReply, KvLookupRequest
from interlock.router.shards import shard_of
from interlock.runtime.interfaces import CallContext, RequestPlane

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 0.1
"""A lookup's answer, at most (a round trip on a data-centre network is well under 1 ms)."""
MAX_LOOKUP_BLOCKS = 1 << 16
"""Hashes one lookup may carry (a million-token prompt at 16 tokens a block); more: no answer."""

_encode = msgspec.msgpack.Encoder().encode
_decode_request = msgspec.msgpack.Decoder(KvLookupRequest).decode
_decode_reply = msgspec.msgpack.Decoder(KvLookupReply).decode
_EMPTY = _encode(KvLookupReply(workers=[], device=[]))


class RemoteChain(list[int]):
    """A request's block hashes, and who holds a prefix of them (from a replica's index)."""

    __slots__ = ("holders", "lower_known")

    def __init__(self, hashes: Iterable[int], holders: dict[str, tuple[int, int]], lower_known: bool) -> None:
        super().__init__(hashes)
        self.holders = holders
        """Worker id -> (leading device blocks, lower-tier blocks right after them)."""
        self.lower_known = lower_known
        """The replica knows of lower tiers (else the lower counts are all 0 and unused)."""


class KvLookup(msgspec.Struct, frozen=True, gc=False):
    """One decision's prefix lookup, per slot (what ``KvIndexer.overlaps`` and
    ``lower_overlaps`` would give)."""

    device: np.ndarray
    lower: np.ndarray | None


def lookup_of(hashes: Sequence[int], slot_of: Callable[[str], int | None], n: int) -> KvLookup | None:
    """``hashes``' remote answer over ``n`` slots; None for plain hashes (look them up locally)."""
    if not isinstance(hashes, RemoteChain):
        return None
    device = np.zeros(n, dtype=np.int32)
    lower = np.zeros(n, dtype=np.int32) if hashes.lower_known else None
    for wid, (held, below) in hashes.holders.items():
        slot = slot_of(wid)
        if slot is not None and slot < n:
            device[slot] = held
            if lower is not None:
                lower[slot] = below
    return KvLookup(device, lower)


class HoldersIndex(Protocol):
    """What the endpoint asks of a model's router (``model_router.Router.kv_holders``)."""

    def kv_holders(self, hashes: Sequence[int]) -> tuple[list[str], list[int], list[int] | None]: ...


class KvLookupServer:
    """The ``kv_lookup`` endpoint of a router service with an index."""

    def __init__(
        self, router_of_model: Callable[[str], HoldersIndex | None], owns: Callable[[str], bool] | None = None
    ) -> None:
        """``owns``: the workers this index keeps (a shard's; None: every one): a router
        also predicts what it routed to the others, which is not this shard's to answer."""
        self._router_of_model = router_of_model
        self._owns = owns
        self.answered = 0

    async def handle(self, payload: bytes, ctx: CallContext) -> AsyncIterator[bytes]:
        reply = self.answer(_decode_request(payload))
        yield _EMPTY if reply is None else _encode(reply)

    def answer(self, req: KvLookupRequest, *, own: bool = False) -> KvLookupReply | None:
        """Who here holds a prefix of ``req``'s hashes (None: nothing to say). ``own``: asked
        by this router itself (not counted as answered for another frontend)."""
        router = self._router_of_model(req.model)
        self.answered += not own
        if router is None or not req.hashes or len(req.hashes) > MAX_LOOKUP_BLOCKS:
            return None
        workers, device, lower = router.kv_holders(req.hashes)
        if self._owns is not None:
            keep = [i for i, w in enumerate(workers) if self._owns(w)]
            workers, device = [workers[i] for i in keep], [device[i] for i in keep]
            lower = None if lower is None else [lower[i] for i in keep]
        return KvLookupReply(workers=workers, device=device, lower=lower)


@dataclass(slots=True)
class KvLookupStats:
    answered: int = 0
    failed: int = 0
    """No answer in time, or a replica that failed: placed by load."""
    no_replica: int = 0
    """No replica with an index known: placed by load."""


class KvLookupClient:
    def __init__(self, requests: RequestPlane, timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
        self._requests = requests
        self._timeout_s = timeout_s
        self.addresses: dict[str, str] = {}
        """Replicas with an index: router id -> ``kv_lookup`` address."""
        self.shards: dict[str, tuple[int, int]] = {}
        """Router id -> the shard of the index it keeps, (I, N); (0, 1): the whole index."""
        self._turn = 0
        self.stats = KvLookupStats()
        self.local: tuple[str, KvLookupServer, tuple[int, int]] | None = None
        """This router's own shard: its address, its server (answered without a round trip)
        and which shard it is, (I, N)."""

    def add(self, router_id: str, address: str, shard: tuple[int, int] = (0, 1)) -> None:
        self.addresses[router_id] = address
        self.shards[router_id] = shard

    def remove(self, router_id: str) -> None:
        self.addresses.pop(router_id, None)
        self.shards.pop(router_id, None)

    def _targets(self) -> tuple[list[tuple[int, str]], int]:
        """The replicas to ask for one lookup and the shard count their answers split by: one
        keeping the whole index, in turn; else one of every shard of the most common count
        (none: a shard has no replica, and its workers are placed by load). A router keeping
        a shard itself asks its own shards (itself without a round trip)."""
        self._turn += 1
        whole = sorted(a for r, a in self.addresses.items() if self.shards.get(r, (0, 1))[1] == 1)
        if whole and self.local is None:
            return [(0, whole[self._turn % len(whole)])], 1
        counts = [n for _, n in self.shards.values() if n > 1]
        if self.local is not None:
            count = self.local[2][1]
        elif counts:
            count = max(set(counts), key=counts.count)
        else:
            return [], 1
        by_shard: dict[int, list[str]] = {}
        for rid, (i, n) in sorted(self.shards.items()):
            if n == count and rid in self.addresses:
                by_shard.setdefault(i, []).append(self.addresses[rid])
        if self.local is not None:  # its own shard: always itself
            by_shard[self.local[2][0]] = [self.local[0]]
        return [(i, held[self._turn % len(held)]) for i, held in sorted(by_shard.items())], count

    async def chain(self, model: str, hashes: list[int]) -> list[int]:
        """``hashes`` with the replicas' answer (a ``RemoteChain``), or as they are without one."""
        if not hashes:
            return hashes
        if not self.addresses:
            self.stats.no_replica += 1
            return hashes
        targets, count = self._targets()
        req = KvLookupRequest(model=model, hashes=hashes)
        payload = _encode(req)
        replies = await asyncio.gather(*(self._ask(a, payload, req) for _, a in targets))
        holders: dict[str, tuple[int, int]] = {}
        lower_known = False
        for (shard_index, _), reply in zip(targets, replies, strict=True):
            if reply is None:
                continue
            lower = reply.lower or [0] * len(reply.workers)
            lower_known = lower_known or reply.lower is not None
            for wid, held, below in zip(reply.workers, reply.device, lower, strict=True):
                if count == 1 or shard_of(wid, count) == shard_index:
                    holders[wid] = (held, below)
        if all(r is None for r in replies):
            return hashes
        return RemoteChain(hashes, holders, lower_known)

    async def _ask(self, address: str, payload: bytes, req: KvLookupRequest) -> KvLookupReply | None:
        if self.local is not None and address == self.local[0]:
            self.stats.answered += 1
            return self.local[1].answer(req, own=True) or KvLookupReply(workers=[], device=[])
        try:
            stream = self._requests.stream(address, payload)
            async with contextlib.aclosing(stream), asyncio.timeout(self._timeout_s):
                reply = _decode_reply(await anext(aiter(stream)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - placed by load instead
            self.stats.failed += 1
            log.debug("KV lookup at %s failed: %s", address, exc)
            return None
        self.stats.answered += 1
        return reply
