"""``interlock`` command: dispatches to one small module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys

from interlock.errors import ConfigError

SUBCOMMANDS = {
    "serve": "interlock.cli.serve",
    "worker": "interlock.cli.worker",
    "frontend": "interlock.cli.frontend",
    "nats": "interlock.cli.nats",
    "bench": "interlock.cli.bench",
    "replay": "interlock.cli.replay",
    "convert": "interlock.cli.convert",
    "doctor": "interlock.cli.doctor",
    "profile": "interlock.cli.profile",
    "planner": "interlock.cli.planner",
    "plan": "interlock.cli.plan",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        from interlock import __version__

        print(f"interlock {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser = argparse.ArgumentParser(
            prog="interlock", description="Serve LLMs: interlock COMMAND --help for each command's flags."
        )
        parser.add_argument("command", choices=sorted(SUBCOMMANDS))
        parser.add_argument("-V", "--version", action="store_true", help="print the version and exit")
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}")
        parser.print_help()
        return 0 if argv else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    try:
        return int(module.main(argv[1:]) or 0)
    except ConfigError as e:  # building a parser from INTERLOCK_* variables (cli.flags)
        print(f"interlock {argv[0]}: {e.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
