"""The KV-transfer descriptor (wire type): what a destination needs to pull a staged KV payload.

The source worker stages the KV of a request's blocks and publishes this descriptor; it travels
with the prefill output (``KVTransferParams.descriptor``) through the router to the decode
worker, which pulls the bytes over the best transport both sides can reach. The identities
below let the destination pick that transport without asking anyone.
"""

from __future__ import annotations

import msgspec


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
