"""Runtime planes: naming, discovery, request plane, event plane (in-process and NATS)."""
