"""Interlock: the coordination layer for serving LLMs at scale."""

__version__ = "0.1.0"
__all__ = ["__version__"]
