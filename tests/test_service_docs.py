"""The API reference in docs/ is the OpenAPI schema rendered, and the schema names every route."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Route

from rollouts.service.api import create_app
from rollouts.service.openapi import openapi, openapi_markdown
from rollouts.service.store import Store

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_is_generated_from_the_schema() -> None:
    assert (ROOT / "docs" / "service-api.md").read_text() == openapi_markdown(), (
        "regenerate it: python -m rollouts.service.openapi > docs/service-api.md"
    )


def test_schema_documents_every_route(tmp_path: Path) -> None:
    app = create_app(Store(f"sqlite:///{tmp_path}/x.db"))
    served = {(r.path, m.lower()) for r in app.routes if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"}
    documented = {(p, m) for p, ops in openapi()["paths"].items() for m in ops}
    public = {("/v1/health", "get"), ("/v1/openapi.json", "get")}
    assert served - public == documented
