"""One error tree for the whole project.

Two families, because callers treat them differently:

* ``RequestError``: the request itself is wrong or was ended (bad input, too long, unknown
  model, aborted). It is the client's business; the system is healthy. Maps to 4xx.
* ``ServiceError``: the system could not serve a valid request (no worker, overloaded, engine
  or transport fault). Maps to 5xx; may be retried elsewhere.

Each class carries the HTTP status and the OpenAI error ``type`` it maps to, so the frontend
never guesses, and a ``code`` (its name in snake case) by which it crosses a process boundary:
``rebuild`` is the one way back from (code, message, param) to the error, on every plane
(request-plane failures, an engine's error in an output chunk).
"""

from __future__ import annotations

import re
from typing import ClassVar


class InterlockError(Exception):
    status: int = 500
    error_type: str = "internal_error"
    code: ClassVar[str] = "interlock_error"
    """Stable name on the wire (set from the class name for every subclass)."""
    _by_code: ClassVar[dict[str, type[InterlockError]]] = {}

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.code = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()
        InterlockError._by_code[cls.code] = cls


def rebuild(code: str, message: str, param: str | None, *, unknown: type[InterlockError]) -> InterlockError:
    """The error another process sent as ``(code, message, param)``, of the class ``code``
    names (so a RequestError stays a 4xx), ``param`` kept; ``unknown`` for a code we do not
    know (a foreign exception, a newer peer)."""
    cls = InterlockError._by_code.get(code, unknown)
    try:
        return cls(message, param=param)
    except TypeError:  # a subclass (outside this module) whose constructor takes no ``param``
        err = cls(message)
        err.param = param
        return err


class Retryable(InterlockError):
    """An error the client should retry after ``retry_after`` seconds (its ``Retry-After``):
    the base of the request and service errors that carry one."""

    def __init__(self, message: str, *, param: str | None = None, retry_after: float = 1.0) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class ConfigError(InterlockError):
    """A configuration value or deployment file is invalid. Raised at start-up, never per request."""

    status = 400
    error_type = "invalid_request_error"


# ---- request errors (client side) ----
class RequestError(InterlockError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(RequestError):
    """Malformed body, wrong type, bad sampling parameter."""


class PromptTooLong(RequestError):
    """Prompt (plus max_tokens) exceeds the model's context length."""


class LimitExceeded(RequestError):
    """The request is over one of the server's configured size limits (prompt characters or
    tokens, JSON nesting); the message names the limit."""


class RequestTimeout(RequestError):
    """The client did not send its whole request in time."""

    status = 408


class Unauthorized(RequestError):
    """No API key, or one the server does not know."""

    status = 401
    error_type = "authentication_error"


class RateLimited(Retryable, RequestError):
    """The API key used up its requests or tokens for this minute; retry after ``retry_after`` s."""

    status = 429
    error_type = "rate_limit_error"


class ModelNotFound(RequestError):
    status = 404
    error_type = "not_found_error"


class NotFound(RequestError):
    """No such path on this server."""

    status = 404
    error_type = "not_found_error"


class MethodNotAllowed(RequestError):
    """The path exists but not for this HTTP method."""

    status = 405
    error_type = "invalid_request_error"


# ---- service errors (server side) ----
class ServiceError(InterlockError):
    status = 500
    error_type = "internal_error"


class ServiceUnavailable(Retryable, ServiceError):
    """No worker can take the request now; the client should retry after ``retry_after`` s."""

    status = 503
    error_type = "service_unavailable"


class NoWorkers(ServiceUnavailable):
    pass


class Overloaded(ServiceUnavailable):
    pass


class EngineError(ServiceError):
    """The engine failed while running a valid request."""


class TransportError(ServiceError):
    """A request-plane, event-plane or KV-transfer fault (peer gone, timeout, broken stream)."""

    status = 502
    error_type = "transport_error"


class WorkerFailed(ServiceError):
    """The workers serving a request kept failing mid-stream past its migration limit."""

    status = 502
    error_type = "worker_failed"


class TransferError(TransportError):
    """A KV transfer failed or was aborted."""


class AuthError(TransportError):
    """A peer failed the cluster-secret handshake, or a server refused our credentials."""

    error_type = "auth_error"
