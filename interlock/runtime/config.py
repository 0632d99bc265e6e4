"""Runtime settings: lease timing, transport timeouts, bind/advertise addresses. Validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from interlock.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    heartbeat_interval: float = 1.0
    """Seconds between a registered instance's heartbeats."""
    lease_timeout: float = 5.0
    """Seconds of silence after which an instance leaves discovery."""
    connect_timeout: float = 2.0
    """Seconds to open a request-plane connection or reach the NATS server."""
    peer_timeout: float = 5.0
    """Seconds a streaming call may hear nothing from its server (not even a keepalive)."""
    host: str = "127.0.0.1"
    """Interface the TCP request plane binds to ("0.0.0.0" to serve other hosts)."""
    port: int = 0
    """TCP request-plane port; 0 lets the OS pick a free one (it is advertised either way)."""
    advertise_host: str | None = None
    """Host put into advertised addresses; defaults to ``host``."""
    request_plane: Literal["tcp", "nats"] = "tcp"
    """Transport for token streams when running over NATS (see docs/design.md for why TCP)."""
    discovery_sync_s: float = 0.1
    """NATS: how long connect waits for live instances to answer the start-up query."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "lease_timeout", "connect_timeout", "peer_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive", param=name)
        if self.lease_timeout <= self.heartbeat_interval:
            raise ConfigError("lease_timeout must exceed heartbeat_interval", param="lease_timeout")
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in 0..65535", param="port")
        if self.request_plane not in ("tcp", "nats"):
            raise ConfigError("request_plane must be 'tcp' or 'nats'", param="request_plane")
        if self.discovery_sync_s < 0:
            raise ConfigError("discovery_sync_s must be >= 0", param="discovery_sync_s")

    @property
    def keepalive_interval(self) -> float:
        """How often a live peer proves it is alive on a busy stream: well inside peer_timeout."""
        return self.peer_timeout / 4
