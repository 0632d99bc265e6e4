"""``interlock convert MODEL``: resolve a model name, GGUF file or folder into a local HF folder.

Converting is what every worker would do at its first start; running it ahead of time keeps
the first start fast. Prints the folder on stdout (progress goes to stderr). A converted folder
already in the cache is verified against its manifest first and reused only if it passes
(``model_store``). Exit status 2, with the reason on stderr, for an unknown name or a file that
is not a GGUF the converter can read; nothing is left in the cache then.
"""

from __future__ import annotations

import sys

from interlock.cli import flags
from interlock.errors import ConfigError
from interlock.model_store import DEFAULT_MODEL, resolve_model


def main(argv: list[str] | None = None) -> int:
    parser = flags.parser(
        "interlock convert",
        "Convert a model (a known name, a .gguf file or a HF folder) into a local folder.",
    )
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=f"default: {DEFAULT_MODEL}")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = flags.apply_environment(parser).parse_args(argv)
    try:
        folder = resolve_model(args.model, progress=not args.quiet)
    except ConfigError as exc:
        print(f"interlock convert: {exc.message}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
