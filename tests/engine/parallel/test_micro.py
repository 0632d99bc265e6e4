"""micro: a step cut into micro-batches, and the requested rows found in their answers."""

from __future__ import annotations

from interlock.engine.model.batch import row_order
from interlock.engine.parallel.micro import MIN_PIECE, cut, pieces, plan


def test_cut_balances_tokens_without_splitting_a_chunk() -> None:
    assert cut([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert cut([100, 1, 1], 2) == [range(0, 1), range(1, 3)]
    assert cut([5], 4) == [range(0, 1)]
    assert cut([1, 1, 1], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert cut([3, 3, 3, 3, 3], 2) == [range(0, 3), range(3, 5)]


def test_rows_are_found_in_the_micro_batches_answers() -> None:
    # Chunks: a prefill of 4, a decode, a prefill of 3, a decode (the batch puts decodes first).
    chunks = (([10, 11, 12, 13], 0, [0]), ([20], 7, [1]), ([30, 31, 32], 0, [2]), ([40], 9, [3]))
    order, last = row_order([4, 1, 3, 1])
    assert order == [1, 3, 0, 2] and last == [5, 0, 8, 1]
    # Rows of the whole batch: every chunk's last row, then row 3 (the prefill's second token).
    rows = [5, 0, 8, 1, 3]
    micro, where = plan(chunks, last, rows, 2)
    assert [len(m.chunks) for m in micro] == [2, 2]
    # Micro-batch 0 is chunks 0 and 1: decode (row 0) then prefill rows 1..4.
    assert micro[0].rows == (4, 0, 2) and micro[1].rows == (3, 0)
    answers = [("m0", r) for r in micro[0].rows] + [("m1", r) for r in micro[1].rows]
    assert [answers[k] for k in where] == [("m0", 4), ("m0", 0), ("m1", 3), ("m1", 0), ("m0", 2)]


def test_a_lone_prompt_is_cut_into_pieces_that_follow_each_other() -> None:
    assert [(p.start, p.length) for p in pieces([100], 2)] == [(0, 50), (50, 50)]
    assert [(p.chunk, p.length) for p in pieces([1, 200], 3)] == [(0, 1), (1, 100), (1, 100)]
    assert len(pieces([2 * MIN_PIECE - 1], 2)) == 1  # too short to cut
    ids = list(range(100))
    micro, where = plan([(ids, 8, [4, 5, 6, 7, 8, 9, 10])], [99], [99, 10, 60], 2)
    assert [m.chunks for m in micro] == [
        ((ids[:50], 8, [4, 5, 6, 7, 8, 9, 10]),),
        ((ids[50:], 58, [4, 5, 6, 7, 8, 9, 10]),),
    ]
    assert micro[0].rows == (10,) and micro[1].rows == (49, 10)
    assert where == [1, 0, 2]
