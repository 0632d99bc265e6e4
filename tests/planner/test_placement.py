"""Placement: workers go only where their cores, devices and memory fit, less the headroom."""

from __future__ import annotations

import random

import pytest

from interlock.planner.placement import GIB, Headroom, Host, Needs, Placed, place, room, used

LOCAL = Host("local", 2.0, 0, 8 * GIB)


def fill(hosts: list[Host], needs: Needs, headroom: Headroom = Headroom()) -> list[tuple[int, str]]:
    """``room`` before each placement, until one does not fit."""
    placed: list[Placed] = []
    rooms = [room(hosts, placed, needs, headroom)]
    while (host := place(hosts, placed, needs, headroom)) is not None:
        placed.append(Placed(host.name, needs))
        rooms.append(room(hosts, placed, needs, headroom))
    return rooms


def test_two_cores_take_two_one_thread_workers() -> None:
    rooms = fill([LOCAL], Needs(1.0, 0, GIB))
    assert [n for n, _ in rooms] == [2, 1, 0]
    assert rooms[-1][1] == "host local: 2.0 of 2 cores used, 0.0 headroom"


def test_headroom_is_kept_free() -> None:
    rooms = fill([LOCAL], Needs(1.0), Headroom(cores=0.5))
    assert [n for n, _ in rooms] == [1, 0]
    assert rooms[-1][1] == "host local: 1.0 of 2 cores used, 0.5 headroom"


def test_memory_binds_when_it_runs_out_first() -> None:
    rooms = fill([Host("a", 16.0, 0, 4 * GIB)], Needs(1.0, 0, 3 * GIB // 2), Headroom(memory_bytes=GIB // 2))
    assert [n for n, _ in rooms] == [2, 1, 0]
    assert rooms[-1][1] == "host a: 3.0 of 4.0 GiB memory used, 0.5 GiB headroom"


def test_devices_bind_and_unknown_memory_is_no_limit() -> None:
    rooms = fill([Host("gpu", 64.0, 2)], Needs(1.0, 1, 100 * GIB))
    assert [n for n, _ in rooms] == [2, 1, 0]
    assert rooms[-1][1] == "host gpu: 2 of 2 devices used"


def test_a_fraction_of_a_core_adds_up_exactly() -> None:
    assert [n for n, _ in fill([LOCAL], Needs(0.1))][0] == 20


def test_best_fit_packs_the_fullest_host_first() -> None:
    hosts = [Host("big", 8.0), Host("small", 2.0)]
    placed = [Placed("big", Needs(5.0))]
    assert place(hosts, placed, Needs(2.0), Headroom()) == hosts[1]  # small: 0 left, big: 1
    assert place(hosts, placed, Needs(3.0), Headroom()) == hosts[0]  # fits only on big
    assert place(hosts, placed, Needs(4.0), Headroom()) is None
    n, why = room(hosts, placed, Needs(4.0), Headroom())
    assert (
        n == 0
        and why
        == "host big: 5.0 of 8 cores used, 0.0 headroom; host small: 0.0 of 2 cores used, 0.0 headroom"
    )


def test_room_with_no_hosts_and_bad_needs() -> None:
    assert room([], [], Needs(1.0), Headroom()) == (0, "no host to place workers on")
    with pytest.raises(ValueError, match="positive"):
        Needs(0.0)


def test_no_sequence_of_placements_oversubscribes_a_host() -> None:
    """Random hosts, random workers added and removed: every host stays within what it has,
    less headroom, in cores, devices and memory; and ``room`` counts exactly the placements
    that then succeed."""
    rng = random.Random(29)
    for _ in range(300):
        hosts = [
            Host(
                f"h{i}",
                rng.choice([1.0, 2.0, 4.0, 6.5]),
                rng.randint(0, 4),
                rng.choice([None, rng.randint(1, 16) * GIB]),
            )
            for i in range(rng.randint(1, 3))
        ]
        headroom = Headroom(rng.choice([0.0, 0.5, 1.0]), rng.choice([0, GIB // 2]))
        placed: list[Placed] = []
        for _ in range(30):
            if placed and rng.random() < 0.3:
                placed.pop(rng.randrange(len(placed)))
                continue
            needs = Needs(
                rng.choice([0.25, 0.5, 1.0, 2.0, 3.0]), rng.choice([0, 0, 1, 2]), rng.randint(0, 3) * GIB
            )
            host = place(hosts, placed, needs, headroom)
            if host is not None:
                placed.append(Placed(host.name, needs))
            for h in hosts:
                cores, devices, memory = used(h, placed)
                assert cores <= h.cores - headroom.cores + 1e-6
                assert devices <= h.devices
                assert h.memory_bytes is None or memory <= h.memory_bytes - headroom.memory_bytes
        n, _ = room(hosts, placed, needs, headroom)
        got = 0
        while got <= n and (host := place(hosts, placed, needs, headroom)) is not None:
            placed.append(Placed(host.name, needs))
            got += 1
        assert got == n
