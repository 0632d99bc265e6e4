"""``interlock`` command: dispatches to one small module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "serve": "interlock.cli.serve",
    "worker": "interlock.cli.worker",
    "frontend": "interlock.cli.frontend",
    "bench": "interlock.cli.bench",
    "replay": "interlock.cli.replay",
    "convert": "interlock.cli.convert",
    "doctor": "interlock.cli.doctor",
    "profile": "interlock.cli.profile",
    "planner": "interlock.cli.planner",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser = argparse.ArgumentParser(prog="interlock")
        parser.add_argument("command", choices=sorted(SUBCOMMANDS))
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}")
        parser.print_help()
        return 0 if argv else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
