"""The SSE write coalescer: one HTTP chunk per event-loop turn, nothing written after the end,
its unread bytes counted."""

from __future__ import annotations

import asyncio

import pytest

from interlock.frontend.generation import Coalescer


class RecordingTransport:
    """The transport calls the coalescer makes, recorded; nothing is ever read."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.high_water = 0

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def set_write_buffer_limits(self, high: int) -> None:
        self.high_water = high

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.writes))


def test_the_buffer_limit_is_the_transports_high_water_mark_and_counts_what_is_unread() -> None:
    async def scenario() -> tuple[int, int, int]:
        t = RecordingTransport()
        c = Coalescer(t, 65536)  # type: ignore[arg-type]
        c.add(b"x" * 100)
        pending = c.backlog()
        await asyncio.sleep(0)
        return t.high_water, pending, c.backlog()

    # Pending in the coalescer, then in the transport (with its chunk framing): both unread.
    assert asyncio.run(scenario()) == (65536, 100, 100 + len(b"64\r\n\r\n"))


def test_chunks_of_one_turn_leave_in_one_http_chunk() -> None:
    async def scenario() -> list[bytes]:
        t = RecordingTransport()
        c = Coalescer(t, 65536)  # type: ignore[arg-type]
        c.add(b"data: a\n\n")
        c.add(b"data: bc\n\n")
        assert t.writes == []  # nothing before the turn ends
        await asyncio.sleep(0)
        c.add(b"data: d\n\n")
        await asyncio.sleep(0)
        return t.writes

    assert asyncio.run(scenario()) == [
        b"13\r\ndata: a\n\ndata: bc\n\n\r\n",
        b"9\r\ndata: d\n\n\r\n",
    ]


def test_take_hands_over_what_is_pending_and_the_flush_then_writes_nothing() -> None:
    async def scenario() -> tuple[bytes, list[bytes]]:
        t = RecordingTransport()
        c = Coalescer(t, 65536)  # type: ignore[arg-type]
        c.add(b"x")
        c.add(b"y")
        taken = c.take()
        await asyncio.sleep(0)
        return taken, t.writes

    assert asyncio.run(scenario()) == (b"xy", [])


def test_a_closed_connection_stops_the_stream() -> None:
    async def scenario() -> None:
        t = RecordingTransport()
        c = Coalescer(t, 65536)  # type: ignore[arg-type]
        c.add(b"x")
        t.closing = True
        await asyncio.sleep(0)  # the pending chunk is dropped, not written to a closing socket
        assert t.writes == []
        with pytest.raises(ConnectionResetError):
            c.add(b"y")

    asyncio.run(scenario())


def test_best_of_positions_rank_each_prompts_copies() -> None:
    from interlock.frontend.generation import best_of_positions, mean_logprob
    from interlock.protocol import TokenLogprobs

    # two prompts, three copies each: copy j of prompt p at j * 2 + p
    scores = [-1.0, -0.5, -0.2, -3.0, -2.0, -0.1]
    assert best_of_positions(scores, prompts=2, keep=2) == [2, 0, 5, 1]
    assert best_of_positions([-1.0, -1.0], prompts=1, keep=1) == [0]  # a tie keeps the first
    assert mean_logprob([TokenLogprobs(1, -1.0), TokenLogprobs(2, -3.0)]) == -2.0
    assert mean_logprob(None) == float("-inf")
