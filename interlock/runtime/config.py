"""Runtime settings: lease timing, transport timeouts, bind/advertise addresses. Validated once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from interlock.errors import ConfigError
from interlock.protocol.handshake import MIN_SECRET_BYTES

MIN_TTL_S = 0.1
MAX_TTL_S = 600.0
"""The lease timeouts anyone may announce (others drop an announcement outside them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NatsAuth:
    """How to authenticate to the NATS server (at most one of user/password, token, creds
    file), and TLS. Secrets are kept out of ``repr``."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    """A NATS ``.creds`` file (JWT + NKey seed), for servers run in operator mode."""
    tls_ca: str | None = None
    """CA bundle that signed the server's certificate; giving it (or a client cert) turns TLS on."""
    tls_cert: str | None = None
    """Client certificate (PEM), for servers that verify clients (``verify: true``)."""
    tls_key: str | None = None

    def __post_init__(self) -> None:
        modes = [
            self.user is not None or self.password is not None,
            self.token is not None,
            self.creds_file is not None,
        ]
        if sum(modes) > 1:
            raise ConfigError("give one of NATS user/password, token or creds file", param="nats_auth")
        if (self.user is None) != (self.password is None):
            raise ConfigError("NATS user and password go together", param="nats_auth")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("NATS TLS cert and key go together", param="nats_auth")

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None


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
    """NATS: how long discovery's first look (``instances``, ``watch``) waits for live instances
    to answer the start-up query."""
    cluster_secret: bytes | None = field(default=None, repr=False)
    """Shared by every process of a deployment: TCP request-plane peers prove they know it
    (``protocol.handshake``) before any request. None: no handshake (loopback use)."""
    nats_auth: NatsAuth = field(default_factory=lambda: NatsAuth())
    """Credentials and TLS for the NATS server."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "lease_timeout", "connect_timeout", "peer_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive", param=name)
        if not MIN_TTL_S <= self.lease_timeout <= MAX_TTL_S:
            raise ConfigError(
                f"lease_timeout must be within {MIN_TTL_S:g}..{MAX_TTL_S:g} s", param="lease_timeout"
            )
        if self.lease_timeout <= self.heartbeat_interval:
            raise ConfigError("lease_timeout must exceed heartbeat_interval", param="lease_timeout")
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in 0..65535", param="port")
        if self.request_plane not in ("tcp", "nats"):
            raise ConfigError("request_plane must be 'tcp' or 'nats'", param="request_plane")
        if self.discovery_sync_s < 0:
            raise ConfigError("discovery_sync_s must be >= 0", param="discovery_sync_s")
        if self.cluster_secret is not None and len(self.cluster_secret) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"cluster secret must be at least {MIN_SECRET_BYTES} bytes", param="cluster_secret"
            )

    @property
    def keepalive_interval(self) -> float:
        """How often a live peer proves it is alive on a busy stream: well inside peer_timeout."""
        return self.peer_timeout / 4
