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
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
