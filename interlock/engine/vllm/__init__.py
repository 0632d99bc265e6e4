"""vLLM's engine behind the worker's seam (``engine.serving``): ``VllmEngine`` (needs vLLM
installed: ``pip install 'interlock[vllm]'``), its argument mapping and its KV event
translation (pure, no vLLM needed)."""

from interlock.engine.vllm.engine import INSTALL_HINT, VllmEngine

__all__ = ["INSTALL_HINT", "VllmEngine"]
