"""vLLM's engine behind the worker's seam (``engine.serving``): ``VllmEngine`` (needs vLLM
installed: ``pip install 'interlock[vllm]'``), its argument mapping and its KV event
translation (pure, no vLLM needed)."""

import importlib.util

from interlock.engine.vllm.engine import INSTALL_HINT, KV_CONNECTOR, Handoff, VllmEngine


def installed() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


__all__ = ["INSTALL_HINT", "KV_CONNECTOR", "Handoff", "VllmEngine", "installed"]
