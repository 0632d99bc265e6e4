"""Metrics: one registry every component registers into (``registry``), the catalogue of every
name (``catalog``, ``docs/metrics.md``), process figures (``process``) and a tiny HTTP server for
processes without a web framework (``http``). Imports nothing else of Interlock."""

from interlock.metrics.catalog import CATALOG, Spec
from interlock.metrics.registry import CONTENT_TYPE, Counter, Gauge, Histogram, Registry

__all__ = ["CATALOG", "CONTENT_TYPE", "Counter", "Gauge", "Histogram", "Registry", "Spec"]
