"""Stop strings across chunk boundaries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from interlock.frontend.stops import StopMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = "".join(m.push(p) for p in pieces)
    return out + m.flush(), m.stopped


def test_no_stops_passes_text_through_at_once() -> None:
    m = StopMatcher([])
    assert m.push("abc") == "abc"
    assert not m.active


def test_stop_split_over_pieces() -> None:
    assert run(["END"], ["hello E", "N", "D and more"]) == ("hello ", True)


def test_tail_is_held_then_released_when_not_a_stop() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("abcST") == "ab"  # "cST" could be the start of "STOP": held
    assert m.push("xyz") == "cST"  # it was not; the new last 3 characters are held
    assert m.flush() == "xyz"
    assert not m.stopped


def test_earliest_of_several_stops_wins() -> None:
    assert run(["world", "lo w"], ["hello world"]) == ("hel", True)


def test_nothing_after_a_stop() -> None:
    m = StopMatcher(["x"])
    assert m.push("abxcd") == "ab"
    assert m.push("more") == ""
    assert m.flush() == ""


@given(
    text=st.text(alphabet="abcXY", max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=6),
    stop=st.text(alphabet="abcXY", min_size=1, max_size=4),
)
def test_same_result_as_matching_the_whole_text(text: str, cuts: list[int], stop: str) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    idx = text.find(stop)
    expected = (text, False) if idx < 0 else (text[:idx], True)
    assert run([stop], pieces) == expected
