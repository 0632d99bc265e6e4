#!/usr/bin/env bash
# Install everything and start `interlock serve` with the default model (SmolLM2-135M-Instruct).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/interlock serve "$@"
