"""The frontend's public API is pinned: changing it is a deliberate act."""

from __future__ import annotations

import interlock.frontend


def test_all_is_pinned() -> None:
    assert sorted(interlock.frontend.__all__) == [
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
    for name in interlock.frontend.__all__:
        assert getattr(interlock.frontend, name) is not None
