"""`rollouts view`: a web UI over sessions, evaluations and GEPA runs.

    from rollouts.view import FilesCatalog, create_app, serve
    app = create_app(FilesCatalog(["~/.rollouts/sessions", "results/"]))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, app, "127.0.0.1", 0)

Pages read through a `Catalog` (rollouts.view.catalog): `FilesCatalog` over local files, or a
database catalog from the rollout service. Needs the `view` extra (starlette, jinja2,
hypercorn).
"""

from rollouts.view._gepa_files import read_reflections
from rollouts.view.app import create_app
from rollouts.view.catalog import Catalog, NotFound, Page, SampleQuery, SessionQuery
from rollouts.view.files import FilesCatalog
from rollouts.view.server import serve

__all__ = [
    "Catalog",
    "FilesCatalog",
    "NotFound",
    "Page",
    "SampleQuery",
    "SessionQuery",
    "create_app",
    "read_reflections",
    "serve",
]
