"""Link check: bandwidth and round-trip time to a peer agent, as the transfers will see them.

RTT is the median of small ping round trips on one control connection. Bandwidth: the peer
stages a probe payload of ``num_blocks`` x ``block_nbytes`` (like a real KV export) and this
agent pulls it over the transport it would pick for a real transfer (or a forced one); the
clock runs from the pull until the bytes sit in memory this side owns (for shared memory and
in-process that includes the one copy out of the source's pages). The median over repeats
(after one warm-up round) makes a ``LinkStats``, which the disaggregation cost model turns into a transfer time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from interlock.errors import AuthError, TransferError
from interlock.transfer.agent import TransferAgent
from interlock.transfer.base import TransferState
from interlock.transfer.tcp import ControlClient


@dataclass(frozen=True, slots=True)
class LinkStats:
    bandwidth_bytes_per_s: float
    rtt_s: float
    measured_at: float
    """Wall-clock time (time.time()) of the measurement."""
    transport: str = ""
    payload_nbytes: int = 0

    def transfer_time_s(self, nbytes: int) -> float:
        """Estimated time to move ``nbytes`` over this link."""
        return self.rtt_s + nbytes / self.bandwidth_bytes_per_s


def measure_link(
    agent: TransferAgent,
    peer_address: str,
    *,
    transport: str | None = None,
    block_nbytes: int = 1 << 20,
    num_blocks: int = 16,
    repeats: int = 5,
    pings: int = 20,
    timeout_s: float = 10.0,
) -> LinkStats:
    """Blocking; run it off the engine thread. Raises TransferError when the link fails."""
    nbytes = block_nbytes * num_blocks
    sink = bytearray(nbytes)
    try:
        with ControlClient(peer_address, timeout_s, agent.cluster_secret) as ctl:
            rtt = statistics.median(ctl.ping() for _ in range(max(1, pings)))
            # One unrecorded round first: it pays for first-touch pages on both sides.
            runs = [
                _timed_pull(agent, ctl, nbytes, sink, transport, timeout_s)
                for _ in range(1 + max(1, repeats))
            ][1:]
    except (OSError, ValueError, AuthError) as e:
        raise TransferError(f"link check to {peer_address} failed: {e}") from e
    return LinkStats(
        bandwidth_bytes_per_s=nbytes / max(statistics.median(s for s, _ in runs), 1e-9),
        rtt_s=rtt,
        measured_at=time.time(),
        transport=runs[-1][1],
        payload_nbytes=nbytes,
    )


def _timed_pull(
    agent: TransferAgent,
    ctl: ControlClient,
    nbytes: int,
    sink: bytearray,
    transport: str | None,
    timeout_s: float,
) -> tuple[float, str]:
    descriptor = ctl.probe(nbytes, timeout_s)
    t0 = time.perf_counter()
    dst = agent.pull(descriptor, timeout_s=timeout_s, transport=transport)
    if not dst.finished_event.wait(timeout_s):
        dst.abort("link check timed out")
    status = dst.poll()
    if status.state is not TransferState.DONE:
        raise TransferError(f"probe transfer failed: {status.reason}")
    if dst.transport != "tcp":
        memoryview(sink)[:] = dst.payload
    elapsed = time.perf_counter() - t0
    dst.release()
    return elapsed, dst.transport
