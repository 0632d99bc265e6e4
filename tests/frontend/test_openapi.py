"""/openapi.json describes every route the app serves, with the request schemas it enforces."""

from __future__ import annotations

import httpx

from interlock.frontend.app import build_app
from interlock.frontend.fake import FakeBackend
from tests.frontend.conftest import Served


def test_openapi_document_covers_every_route(served: Served) -> None:
    r = httpx.get(served.url + "/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"] == "3.1.0"
    routes = {
        (route.method.lower(), route.resource.canonical)
        for route in build_app(FakeBackend([])).router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == routes
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and {"model", "messages"} <= set(chat["required"])
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    assert doc["paths"]["/health"]["get"]["security"] == []
