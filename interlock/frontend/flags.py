"""Command-line flags for the HTTP frontend's limits, API keys and TLS, beside the config they
fill. ``interlock frontend`` adds them with ``add_frontend_args``; any other command serving
HTTP can do the same and build its ``FrontendConfig`` with ``frontend_config``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from interlock.errors import ConfigError
from interlock.frontend.auth import OPEN_PATHS, AuthConfig
from interlock.frontend.config import FrontendConfig

_DEFAULTS = FrontendConfig()


def add_frontend_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("HTTP limits, API keys and TLS")
    _add_auth_args(g)
    _add_request_size_args(g)
    _add_body_pace_args(g)
    _add_connection_args(g)
    _add_client_args(g)
    _add_stream_args(g)
    g.add_argument("--ssl-certfile", default=None)
    g.add_argument("--ssl-keyfile", default=None)


def _add_auth_args(g: argparse._ArgumentGroup) -> None:
    """API keys, the paths open without one, and the rate limits per key (``AuthConfig``)."""
    g.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="accept this API key (repeatable; also INTERLOCK_API_KEYS, comma-separated)",
    )
    g.add_argument(
        "--api-key-file",
        type=Path,
        metavar="FILE",
        help="accept the API keys in FILE, one a line (# starts a comment)",
    )
    g.add_argument(
        "--open-path",
        action="append",
        default=None,
        metavar="PATH",
        help=f"path served without a key (repeatable; default {' '.join(OPEN_PATHS)})",
    )
    g.add_argument("--rate-limit-rpm", type=int, default=None, help="requests per minute per API key")
    g.add_argument("--rate-limit-tpm", type=int, default=None, help="tokens per minute per API key")


def _add_request_size_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max-prompt-chars", type=int, default=_DEFAULTS.max_prompt_chars)
    g.add_argument("--max-prompt-tokens", type=int, default=_DEFAULTS.max_prompt_tokens)
    g.add_argument("--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes)
    g.add_argument("--max-json-depth", type=int, default=_DEFAULTS.max_json_depth)


def _add_body_pace_args(g: argparse._ArgumentGroup) -> None:
    """How slowly a request head and body may arrive."""
    g.add_argument(
        "--idle-timeout",
        type=float,
        default=_DEFAULTS.idle_timeout_s,
        help="seconds an open connection may go without a complete request head",
    )
    g.add_argument("--body-timeout", type=float, default=_DEFAULTS.body_timeout_s)
    g.add_argument(
        "--min-body-rate",
        type=int,
        default=_DEFAULTS.min_body_rate,
        metavar="BYTES",
        help="bytes a second a request body must average once --body-grace has passed; slower gets "
        "a 408 (0: only --body-timeout)",
    )
    g.add_argument(
        "--body-grace",
        type=float,
        default=_DEFAULTS.body_grace_s,
        metavar="S",
        help="seconds a request body may take before --min-body-rate applies",
    )


def _add_connection_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--max-connections",
        type=int,
        default=_DEFAULTS.max_connections,
        help="open connections at most; at the cap a newcomer takes the slot of an idle or "
        "still-uploading connection of the client holding the most, if it holds more than the "
        "newcomer's",
    )
    g.add_argument(
        "--max-client-connections",
        type=int,
        default=_DEFAULTS.max_client_connections,
        help="open connections per client address (an IPv6 /64); behind a proxy, raise it to "
        "--max-connections",
    )
    g.add_argument(
        "--reserved-connections",
        type=int,
        default=_DEFAULTS.reserved_connections,
        help="connections beyond --max-connections that serve only /health, /live and /metrics (0: none)",
    )


def _add_client_args(g: argparse._ArgumentGroup) -> None:
    """What one client may ask for at once."""
    g.add_argument(
        "--max-client-requests",
        type=int,
        default=_DEFAULTS.max_client_requests,
        help="generation requests in flight per client address, and per API key; more get a 429",
    )
    g.add_argument(
        "--max-header-chars",
        type=int,
        default=_DEFAULTS.max_header_chars,
        help="longest value of x-request-id, x-session-id, x-worker-id, x-priority and the route-key "
        "header; longer gets a 400",
    )


def _add_stream_args(g: argparse._ArgumentGroup) -> None:
    """A client that reads its stream slowly."""
    g.add_argument(
        "--max-stream-buffer",
        type=int,
        default=_DEFAULTS.max_stream_buffer_bytes,
        metavar="BYTES",
        help="bytes of a stream its client has not read that are held before the stream waits for it",
    )
    g.add_argument(
        "--stream-stall-timeout",
        type=float,
        default=_DEFAULTS.stream_stall_timeout_s,
        metavar="S",
        help="seconds a stream waits for its client to read before it is aborted",
    )


def frontend_config(
    args: argparse.Namespace, *, env_api_keys: tuple[str, ...] = (), base: FrontendConfig = _DEFAULTS
) -> FrontendConfig:
    """The FrontendConfig the flags describe (validated), on top of ``base``."""
    keys = [*args.api_key, *env_api_keys]
    if args.api_key_file is not None:
        keys += _read_keys(args.api_key_file)
    auth = AuthConfig(
        api_keys=tuple(dict.fromkeys(keys)),
        open_paths=tuple(args.open_path) if args.open_path is not None else OPEN_PATHS,
        requests_per_minute=args.rate_limit_rpm,
        tokens_per_minute=args.rate_limit_tpm,
    )
    return replace(
        base,
        auth=auth,
        max_prompt_chars=args.max_prompt_chars,
        max_prompt_tokens=args.max_prompt_tokens,
        max_body_bytes=args.max_body_bytes,
        max_json_depth=args.max_json_depth,
        idle_timeout_s=args.idle_timeout,
        body_timeout_s=args.body_timeout,
        min_body_rate=args.min_body_rate,
        body_grace_s=args.body_grace,
        max_connections=args.max_connections,
        max_client_connections=args.max_client_connections,
        reserved_connections=args.reserved_connections,
        max_client_requests=args.max_client_requests,
        max_header_chars=args.max_header_chars,
        max_stream_buffer_bytes=args.max_stream_buffer,
        stream_stall_timeout_s=args.stream_stall_timeout,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )


def _read_keys(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc}") from exc
    return [k for k in (line.split("#", 1)[0].strip() for line in lines) if k]
