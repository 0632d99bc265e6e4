"""Mutual HMAC challenge-response on the cluster secret, at the start of a TCP connection.

Used by the request plane and the KV-transfer connections: a peer that does not know the
secret learns nothing and is dropped before any request is read. Sans-I/O: the transports move
these fixed-size messages; this module only builds and checks them.

    client -> server  HELLO      MAGIC + client nonce                 (20 bytes)
    server -> client  CHALLENGE  server nonce + HMAC(secret, "server" | cn | sn)   (48 bytes)
    client -> server  RESPONSE   HMAC(secret, "client" | cn | sn)     (32 bytes)

Both nonces are fresh per connection, so a recorded exchange replays nowhere; the two labels
keep one side's proof from being reflected as the other's. The server proves itself first
(the client refuses a fake worker before sending a request), and reads nothing past HELLO and
RESPONSE until the client's proof checks out. One round trip per connection; connections are
long-lived, so the per-request cost is nil. The secret is never sent.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os

from interlock.errors import AuthError

MAGIC = b"ILK\x01"
"""Read as a frame length by a peer without a secret, it is over 1 GiB: that peer drops us."""
NONCE_SIZE = 16
PROOF_SIZE = 32
HELLO_SIZE = len(MAGIC) + NONCE_SIZE
CHALLENGE_SIZE = NONCE_SIZE + PROOF_SIZE
RESPONSE_SIZE = PROOF_SIZE
MIN_SECRET_BYTES = 16


def is_loopback(host: str) -> bool:
    """Only loopback may listen without a secret quietly; a name or a wildcard may be reachable."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_secret(secret: bytes) -> bytes:
    """The secret, if long enough to be one (AuthError otherwise)."""
    if len(secret) < MIN_SECRET_BYTES:
        raise AuthError(f"cluster secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def _proof(secret: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, label + client_nonce + server_nonce, hashlib.sha256).digest()


class ClientHandshake:
    """``hello()`` first; ``answer(challenge)`` checks the server and gives the response."""

    def __init__(self, secret: bytes) -> None:
        self._secret = check_secret(secret)
        self._nonce = os.urandom(NONCE_SIZE)

    def hello(self) -> bytes:
        return MAGIC + self._nonce

    def answer(self, challenge: bytes) -> bytes:
        if len(challenge) != CHALLENGE_SIZE:
            raise AuthError("malformed handshake challenge")
        server_nonce, proof = challenge[:NONCE_SIZE], challenge[NONCE_SIZE:]
        if not hmac.compare_digest(proof, _proof(self._secret, b"server", self._nonce, server_nonce)):
            raise AuthError("peer does not know the cluster secret")
        return _proof(self._secret, b"client", self._nonce, server_nonce)


class ServerHandshake:
    """``challenge(hello)`` answers a client's hello; ``verify(response)`` checks the client."""

    def __init__(self, secret: bytes) -> None:
        self._secret = check_secret(secret)
        self._nonce = os.urandom(NONCE_SIZE)
        self._client_nonce: bytes | None = None

    @property
    def expecting_hello(self) -> bool:
        return self._client_nonce is None

    def challenge(self, hello: bytes) -> bytes:
        if len(hello) != HELLO_SIZE or hello[: len(MAGIC)] != MAGIC:
            raise AuthError("peer did not open with the cluster handshake")
        self._client_nonce = hello[len(MAGIC) :]
        return self._nonce + _proof(self._secret, b"server", self._client_nonce, self._nonce)

    def verify(self, response: bytes) -> None:
        if self._client_nonce is None:
            raise AuthError("handshake response before hello")
        expected = _proof(self._secret, b"client", self._client_nonce, self._nonce)
        if len(response) != RESPONSE_SIZE or not hmac.compare_digest(response, expected):
            raise AuthError("peer does not know the cluster secret")
