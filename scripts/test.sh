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
# Three xdist workers: the end-to-end files in two groups of their own (tests/conftest.py), the
# rest module by module beside them: 13 minutes on 2 cores against 23-25 in one process.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n 3 "$@"
