#!/usr/bin/env bash
# Install everything and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
# With vLLM's CPU build, so the vLLM worker tests run (tests/e2e/test_vllm*.py skip without it).
./scripts/setup.sh --vllm
.venv/bin/ruff check interlock tests benchmarks
.venv/bin/ruff format --check interlock tests benchmarks
.venv/bin/lint-imports
.venv/bin/mypy interlock
# Two xdist workers: the end-to-end files in two groups of their own first (tests/conftest.py),
# then the rest module by module: 15-23 minutes on 2 cores (by CPU) against 23-25 in one process. A
# third worker took 13-15 minutes but starved the short leases of tests that serve beside it.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n 2 "$@"
