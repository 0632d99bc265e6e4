"""/openapi.json describes every route the app serves, with the request schemas it enforces."""

from __future__ import annotations

import httpx

from interlock.frontend.app import build_app
from interlock.frontend.fake import FakeBackend
from interlock.frontend.openapi import openapi_document
from tests.frontend.conftest import Served


def test_openapi_document_covers_every_route(served: Served) -> None:
    r = httpx.get(served.url + "/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"] == "3.1.0"
    routes = {
        (route.method.lower(), route.resource.canonical)
        for route in build_app(FakeBackend([])).router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and not route.resource.canonical.startswith("/dashboard")  # for people, not the API
        and route.resource.canonical != "/"  # a browser's way to the dashboard
    }
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == routes
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and {"model", "messages"} <= set(chat["required"])
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    assert doc["paths"]["/health"]["get"]["security"] == []


def test_the_document_carries_the_checks_made_after_decoding() -> None:
    # Those a schema-valid body could otherwise break: schemathesis sends such bodies.
    schemas = openapi_document("0")["components"]["schemas"]
    chat, completion = (
        schemas["ChatCompletionRequest"]["properties"],
        schemas["CompletionRequest"]["properties"],
    )
    assert chat["messages"]["minItems"] == 1 and chat["n"]["maximum"] == 64
    assert chat["top_k"]["anyOf"][0]["maximum"] == 2**31 - 1 and chat["top_k"]["minimum"] == -1
    assert completion["stop_token_ids"]["anyOf"][0]["items"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 2**31 - 1,
    }
    assert completion["prompt"]["anyOf"][0] == {"type": "string", "minLength": 1}
    assert [part["required"] for part in schemas["ContentPart"]["anyOf"]] == [
        ["type", "text"],
        ["type", "refusal"],
    ]
    assert {"if", "then"} <= set(schemas["CompletionRequest"]["allOf"][0])
