"""Who gives way at the connection cap, and the in-flight count per client: plain calls."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from interlock.frontend.fairness import Admit, ConnectionLimits, InFlight, State, admit, client_of

LIMITS = ConnectionLimits(max_connections=4, max_client_connections=10, reserved_connections=2)


@dataclass(eq=False)
class Conn:
    client: str
    state: State


def pools(regular: str, reserve: str = "") -> tuple[list[Conn], list[Conn]]:
    """Connections written as 'a:I b:R ...' (client:state), oldest first."""

    def parse(text: str) -> list[Conn]:
        return [Conn(c, State[{"I": "IDLE", "R": "RECEIVING", "S": "SERVING"}[s]]) for c, s in _pairs(text)]

    return parse(regular), parse(reserve)


def _pairs(text: str) -> list[tuple[str, str]]:
    return [(p.split(":")[0], p.split(":")[1]) for p in text.split()]


def decide(
    client: str, regular: list[Conn], reserve: list[Conn], limits: ConnectionLimits = LIMITS
) -> Admit[Conn] | None:
    counts = Counter(c.client for c in regular + reserve)
    return admit(client, regular, reserve, counts, limits)


def test_under_the_cap_everyone_gets_a_regular_slot() -> None:
    regular, reserve = pools("a:S a:S b:S")
    assert decide("c", regular, reserve) == Admit(False)


def test_the_largest_client_gives_way_to_a_newcomer_idle_connections_first() -> None:
    regular, reserve = pools("a:R a:I a:R b:I")
    assert decide("c", regular, reserve) == Admit(False, regular[1])  # a's idle one, not b's
    regular, reserve = pools("a:R a:R a:R b:I")
    assert decide("c", regular, reserve) == Admit(False, regular[0])  # a's upload before b's only one
    regular, reserve = pools("b:I a:S a:S c:I")
    assert decide("d", regular, reserve) == Admit(False, regular[0])  # equals: the oldest


def test_the_crowd_never_takes_a_smaller_clients_slot() -> None:
    regular, reserve = pools("a:R a:R a:R b:I")
    # a holds 3, b holds 1: a's newcomer gets a reserve slot (probes only), not b's connection.
    assert decide("a", regular, reserve) == Admit(True)
    regular, reserve = pools("a:R a:R a:R b:I", "a:I a:I")
    assert decide("a", regular, reserve) == Admit(True, reserve[0])  # its own idle reserve one
    regular, reserve = pools("a:R a:R a:R b:I", "b:I b:S")
    assert decide("a", regular, reserve) is None


def test_a_client_takes_its_own_idle_slot_but_never_cuts_its_own_upload() -> None:
    regular, reserve = pools("a:R a:I a:S a:S")
    assert decide("a", regular, reserve) == Admit(False, regular[1])
    regular, reserve = pools("a:R a:S a:S a:S")
    assert decide("a", regular, reserve) == Admit(True)


def test_serving_connections_are_never_evicted() -> None:
    regular, reserve = pools("a:S a:S a:S a:S", "a:S a:S")
    assert decide("b", regular, reserve) is None
    assert decide("b", *pools("a:S a:S a:S a:S")) == Admit(True)  # probes still answer


def test_the_per_client_cap_takes_the_clients_own_idle_slot_or_refuses() -> None:
    limits = ConnectionLimits(max_connections=100, max_client_connections=2, reserved_connections=2)
    regular, reserve = pools("a:S a:I b:I")
    assert decide("a", regular, reserve, limits) == Admit(False, regular[1])
    regular, reserve = pools("a:S b:I", "a:I")
    assert decide("a", regular, reserve, limits) == Admit(True, reserve[0])
    assert decide("a", *pools("a:S a:R b:I"), limits) is None
    assert decide("b", *pools("a:S a:R b:I"), limits) == Admit(False)


def test_clients_are_addresses_and_ipv6_hosts_count_by_their_64() -> None:
    assert client_of(("10.0.0.7", 5555)) == "10.0.0.7"
    assert client_of(("2001:db8:1:2:aaaa::1", 5555, 0, 0)) == client_of(("2001:db8:1:2:bbbb::2", 1, 0, 0))
    assert client_of(("2001:db8:1:2::1", 5555, 0, 0)) != client_of(("2001:db8:1:3::1", 5555, 0, 0))
    assert client_of(("::ffff:10.0.0.7", 1, 0, 0)) == "10.0.0.7"
    assert client_of("/run/interlock.sock") == "/run/interlock.sock"
    assert client_of(None) == "?"


def test_in_flight_counts_every_identity_and_refuses_at_any_cap() -> None:
    flight = InFlight(2)
    assert flight.admit(("10.0.0.7", ("key", 0)))
    assert flight.admit(("10.0.0.8", ("key", 0)))
    assert not flight.admit(("10.0.0.9", ("key", 0)))  # the key is at its cap from two addresses
    assert flight.admit(("10.0.0.7",))
    assert not flight.admit(("10.0.0.7",))
    flight.release(("10.0.0.7", ("key", 0)))
    assert flight.admit(("10.0.0.9", ("key", 0)))
    for ids in (("10.0.0.7",), ("10.0.0.8", ("key", 0)), ("10.0.0.9", ("key", 0))):
        flight.release(ids)
    assert len(flight) == 0
