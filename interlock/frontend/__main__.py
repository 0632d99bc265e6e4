"""``python -m interlock.frontend --model-path DIR``: the frontend over a FakeBackend.

For measuring the frontend's own overhead (the model time is ``--token-delay-ms``), and for
tests that need the frontend in a process of its own (its memory alone), with the same HTTP
limits as ``interlock frontend`` (``flags.py``); the real deployment starts the frontend through
``interlock frontend`` / ``interlock serve``.
"""

from __future__ import annotations

import argparse
import logging

from interlock.frontend.app import run_frontend
from interlock.frontend.backend import ModelEntry
from interlock.frontend.fake import FakeBackend, FakeScript
from interlock.frontend.flags import add_frontend_args, frontend_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m interlock.frontend", description=__doc__)
    parser.add_argument("--model-path", required=True, help="folder with tokenizer.json")
    parser.add_argument("--model-name", default="fake")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    add_frontend_args(parser)
    args = parser.parse_args(argv)
    config = frontend_config(args)
    logging.basicConfig(level=logging.INFO)
    backend = FakeBackend(
        [ModelEntry(args.model_name, args.model_path, args.context_length)],
        FakeScript(token_delay_s=args.token_delay_ms / 1000),
        keep_history=False,
    )
    run_frontend(backend, args.host, args.port, config=config)


if __name__ == "__main__":
    main()
