"""The OpenAI-compatible HTTP frontend: text in, tokens to a ``Backend``, text out.

Public API: ``build_app`` / ``serve_frontend`` / ``run_frontend`` with a ``FrontendConfig``; the
seam ``Backend`` with ``ModelEntry`` and ``RequestContext``; ``FakeBackend`` for tests and
benchmarks.
"""

from interlock.frontend.app import FrontendServer, build_app, run_frontend, serve_frontend
from interlock.frontend.backend import Backend, ModelEntry, RequestContext
from interlock.frontend.config import FrontendConfig
from interlock.frontend.fake import FakeBackend, FakeScript

__all__ = [
    "Backend",
    "FakeBackend",
    "FakeScript",
    "FrontendConfig",
    "FrontendServer",
    "ModelEntry",
    "RequestContext",
    "build_app",
    "run_frontend",
    "serve_frontend",
]
