"""The cluster handshake as plain calls: both sides agree only on the same secret."""

from __future__ import annotations

import pytest

from interlock.errors import AuthError
from interlock.protocol.handshake import (
    CHALLENGE_SIZE,
    HELLO_SIZE,
    RESPONSE_SIZE,
    ClientHandshake,
    ServerHandshake,
    is_loopback,
)

SECRET = b"s" * 32
OTHER = b"o" * 32


def test_same_secret_passes_both_ways() -> None:
    client, server = ClientHandshake(SECRET), ServerHandshake(SECRET)
    hello = client.hello()
    challenge = server.challenge(hello)
    response = client.answer(challenge)
    assert (len(hello), len(challenge), len(response)) == (HELLO_SIZE, CHALLENGE_SIZE, RESPONSE_SIZE)
    server.verify(response)
    assert SECRET not in hello + challenge + response


def test_client_refuses_a_server_without_the_secret() -> None:
    client = ClientHandshake(SECRET)
    with pytest.raises(AuthError, match="does not know"):
        client.answer(ServerHandshake(OTHER).challenge(client.hello()))


def test_server_refuses_a_client_without_the_secret() -> None:
    server = ServerHandshake(SECRET)
    impostor = ClientHandshake(OTHER)
    challenge = server.challenge(impostor.hello())
    with pytest.raises(AuthError):
        impostor.answer(challenge)  # it cannot check us...
    with pytest.raises(AuthError, match="does not know"):
        server.verify(b"\0" * RESPONSE_SIZE)  # ...and cannot make a response we accept


def test_the_server_proof_cannot_be_reflected_or_replayed() -> None:
    client, server = ClientHandshake(SECRET), ServerHandshake(SECRET)
    challenge = server.challenge(client.hello())
    with pytest.raises(AuthError):
        server.verify(challenge[16:])  # the server's own proof, sent back
    response = client.answer(challenge)
    fresh = ServerHandshake(SECRET)
    fresh.challenge(ClientHandshake(SECRET).hello())
    with pytest.raises(AuthError):
        fresh.verify(response)  # recorded from another connection


def test_malformed_messages_and_short_secrets() -> None:
    with pytest.raises(AuthError, match="did not open"):
        ServerHandshake(SECRET).challenge(b"\0\0\0\x10" + b"x" * 16)  # a frame, not a hello
    with pytest.raises(AuthError, match="before hello"):
        ServerHandshake(SECRET).verify(b"x" * RESPONSE_SIZE)
    with pytest.raises(AuthError, match="at least"):
        ClientHandshake(b"short")


def test_is_loopback() -> None:
    assert (
        is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    )
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.2") and not is_loopback("worker-3")
