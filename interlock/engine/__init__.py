"""The embedded engine: paged KV cache, token-budget scheduler, model runners."""
