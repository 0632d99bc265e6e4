"""Endpoint names: ``namespace.component.endpoint``, parsed and validated in one place.

Every name used on the planes comes from here, so a subject, a key or an address path is
never assembled by hand elsewhere. Each part is a NATS-safe token (letters, digits, ``_``,
``-``), which keeps subjects free of accidental wildcards or separators.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlock.errors import ConfigError
from interlock.protocol.discovery import NAME_TOKEN as _TOKEN

SUBJECT_PREFIX = "interlock"
"""First token of every subject Interlock publishes on, so it can share a NATS server."""


def check_token(value: str, what: str) -> str:
    """Return ``value`` if it is a valid name token, else raise ConfigError naming ``what``."""
    if not _TOKEN.match(value):
        raise ConfigError(f"invalid {what} {value!r}: use 1-64 letters, digits, '_' or '-'", param=what)
    return value


@dataclass(frozen=True, slots=True)
class EndpointName:
    namespace: str
    component: str
    endpoint: str

    def __post_init__(self) -> None:
        check_token(self.namespace, "namespace")
        check_token(self.component, "component")
        check_token(self.endpoint, "endpoint")

    @classmethod
    def parse(cls, text: str) -> EndpointName:
        parts = text.split(".")
        if len(parts) != 3:
            raise ConfigError(
                f"invalid endpoint name {text!r}: expected namespace.component.endpoint",
                param="endpoint",
            )
        return cls(*parts)

    @classmethod
    def of(cls, name: EndpointName | str) -> EndpointName:
        """Accept either form at API edges."""
        return name if isinstance(name, EndpointName) else cls.parse(name)

    def __str__(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint}"

    def key(self, instance_id: str | None = None) -> str:
        """Handler key on a request-plane server: the endpoint, plus the instance if given."""
        if instance_id is None:
            return str(self)
        return f"{self}.{check_token(instance_id, 'instance_id')}"

    def subject(self, *suffix: str) -> str:
        """An event-plane subject under this endpoint, e.g. ``subject("kv", instance_id)``.

        ``*`` and ``>`` are allowed as tokens, for subscriptions (``subject("kv", "*")``).
        """
        for token in suffix:
            if token not in ("*", ">"):
                check_token(token, "subject token")
        return ".".join((SUBJECT_PREFIX, str(self), *suffix))


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard semantics: ``*`` matches one token, a final ``>`` one or more."""
    pat = pattern.split(".")
    sub = subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return i == len(pat) - 1 and len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)
