import pytest

from interlock.errors import Overloaded
from interlock.router.admission import AdmissionQueue, RequestMeta


def meta(rid: str, priority: int = 0) -> RequestMeta:
    return RequestMeta(request_id=rid, prompt_tokens=10, priority=priority)


def test_lower_priority_value_first_then_fifo_and_bounded() -> None:
    q = AdmissionQueue(capacity=3, retry_after_s=2.5)
    q.push(meta("a"), (), 0.0)
    q.push(meta("b", priority=-5), (), 0.0)
    q.push(meta("c"), (), 0.0)
    with pytest.raises(Overloaded) as exc:
        q.push(meta("d", priority=9), (), 0.0)
    assert exc.value.retry_after == 2.5 and exc.value.status == 503
    assert [q.pop().meta.request_id for _ in range(3)] == ["b", "a", "c"]
    assert q.peek() is None


def test_cancelled_requests_are_skipped() -> None:
    q = AdmissionQueue()
    q.push(meta("a"), (), 0.0)
    q.push(meta("b"), (), 0.0)
    assert q.cancel("a") and not q.cancel("zzz")
    assert len(q) == 1 and q.pop().meta.request_id == "b"


def test_roles_of_the_waiting_requests() -> None:
    q = AdmissionQueue()
    q.push(RequestMeta("a", 10, role="prefill"), (), 0.0)
    q.push(RequestMeta("b", 10, role="decode"), (), 0.0)
    q.push(RequestMeta("c", 10), (), 0.0)
    assert q.roles() == {"prefill", "decode", None}
    assert q.cancel("b") and q.roles() == {"prefill", None}
    p = q.pop()
    assert p.meta.request_id == "a" and q.roles() == {None}
    q.requeue(p)
    assert q.roles() == {"prefill", None} and len(q) == 2


def test_roles_passed_over_keep_their_order_and_others_go_first() -> None:
    q = AdmissionQueue()
    for i in range(5):
        q.push(RequestMeta(f"p{i}", 10, role="prefill"), (), 0.0)
    q.push(RequestMeta("d", 10, role="decode", priority=1), (), 0.0)
    q.push(RequestMeta("x", 10, role="prefill"), (), 0.0)
    assert q.cancel("p0")
    assert q.peek().meta.request_id == "p1"  # type: ignore[union-attr]
    assert q.pop({"prefill"}).meta.request_id == "d"  # behind six prefill requests
    assert q.peek({"prefill"}) is None
    with pytest.raises(IndexError):
        q.pop({"prefill"})
    assert [q.pop().meta.request_id for _ in range(len(q))] == ["p1", "p2", "p3", "p4", "x"]


def test_take_roles_takes_only_those_roles() -> None:
    q = AdmissionQueue()
    q.push(RequestMeta("a", 10, role="prefill"), (), 0.0)
    q.push(RequestMeta("b", 10, role="decode"), (), 0.0)
    q.push(RequestMeta("c", 10, role="prefill"), (), 0.0)
    assert q.cancel("c")
    assert [m.request_id for m in q.take_roles({"prefill"})] == ["a"]
    assert q.roles() == {"decode"} and q.pop().meta.request_id == "b"
