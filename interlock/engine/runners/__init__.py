"""Model runners: ``torch`` (real PyTorch, paged KV) and ``mock`` (deterministic, timed)."""
