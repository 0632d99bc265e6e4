import pytest

from interlock.errors import ConfigError
from interlock.runtime.naming import EndpointName, subject_matches


def test_parse_round_trip() -> None:
    name = EndpointName.parse("dyn.backend.generate")
    assert name == EndpointName("dyn", "backend", "generate")
    assert str(name) == "dyn.backend.generate"
    assert EndpointName.of(name) is name
    assert EndpointName.of("dyn.backend.generate") == name


@pytest.mark.parametrize("text", ["a.b", "a.b.c.d", "a..c", "a.b.c*", "a.b.>", "a b.c.d", ""])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        EndpointName.parse(text)


def test_key_and_subject() -> None:
    name = EndpointName("ns", "worker", "generate")
    assert name.key() == "ns.worker.generate"
    assert name.key("w-1") == "ns.worker.generate.w-1"
    assert name.subject("kv", "w-1") == "interlock.ns.worker.generate.kv.w-1"
    assert name.subject("kv", "*") == "interlock.ns.worker.generate.kv.*"
    with pytest.raises(ConfigError):
        name.key("a.b")
    with pytest.raises(ConfigError):
        name.subject("kv.x")


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.*.c", "a.x.c", True),
        ("a.*.c", "a.x.y.c", False),
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        ("a.>", "a", False),
        ("*", "a", True),
        ("*", "a.b", False),
        ("a.b", "a.b.c", False),
    ],
)
def test_subject_matches(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected
