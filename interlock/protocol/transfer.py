"""The KV-transfer descriptor (wire type): what a destination needs to pull a staged KV payload.

The source worker stages the KV of a request's blocks and publishes this descriptor; it travels
with the prefill output (``KVTransferParams.descriptor``) through the router to the decode
worker, which pulls the bytes over the best transport both sides can reach. The identities
below let the destination pick that transport without asking anyone.
"""

from __future__ import annotations

import msgspec


class SharedCacheRegion(msgspec.Struct, frozen=True, kw_only=True):
    """A source's KV cache on a memfd, as another process of the same user on its host maps it:
    ``/proc/<pid>/fd/<fd>`` (the file's inode must be ``ino``: a reused pid or fd is refused),
    ``num_blocks`` blocks of ``pieces`` pieces of ``piece`` bytes of ``dtype`` (the geometry of
    ``engine/model/csrc/kv_copy.c``). The destination copies blocks straight from it into its
    own cache when the layouts match (one copy; ``interlock.engine.shared_cache``)."""

    pid: int
    fd: int
    ino: int
    num_blocks: int
    piece: int
    pieces: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.pieces * self.piece

    def layout(self) -> tuple[int, int, str]:
        """What two caches must share for a block copy between them (not their block counts)."""
        return (self.piece, self.pieces, self.dtype)


class TransferDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    transfer_id: str
    nbytes: int
    """Payload size: number of blocks x bytes per block (may be 0)."""
    agent_id: str
    """Unique id of the source's transfer agent; equal in the destination's process -> in-process."""
    host_id: str
    """Identity of the source's host and /dev/shm namespace; equal -> shared memory is reachable."""
    pid: int
    """Source process id (liveness checks on the same host)."""
    shm_name: str = ""
    """File under /dev/shm holding the payload; empty when the source staged in private memory."""
    shm_generation: int = 0
    """Which use of that (reused) file holds this payload."""
    tcp_address: str = ""
    """``host:port`` of the source agent's TCP server; empty when it has none."""
    expires_at: float = 0.0
    """Wall-clock time (time.time()) after which the source frees the payload."""
    layout: tuple[int, int, str] | None = None
    """The payload's block layout, ``(piece, pieces, dtype)`` as ``SharedCacheRegion.layout``:
    a destination whose cache differs (another dtype of the same size per block: fp16 against
    bf16) refuses the pull and computes the prompt instead of importing bytes it would misread.
    None: the source did not say (blocks of other sizes still fail the payload's size check)."""
    cache_region: SharedCacheRegion | None = None
    """The source's KV cache when it is shared (a memfd): a destination on this host that can
    map it claims the transfer DIRECT and copies the blocks straight from it (the request's
    ``source_block_ids``); the source then exports nothing and holds the blocks until DONE, an
    abort or the timeout. None: staged only."""
