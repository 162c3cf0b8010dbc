"""Shared fixtures. Tests never touch the internet: servers they need are started here on 127.0.0.1.

Databases for the service tests: `db_url` is parametrized over SQLite (a file) and a real
PostgreSQL started once per session from the system's binaries (`apt-get install -y postgresql`;
missing binaries fail the run, never skip it), one fresh database per test."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollouts.service.testing import PostgresUnavailable, TemporaryPostgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[TemporaryPostgres]:
    root = tempfile.mkdtemp(prefix="rollouts-pg-")  # (under /tmp: the postgres user must reach it)
    try:
        pg = TemporaryPostgres(root)
    except PostgresUnavailable as e:
        pytest.fail(f"{e} (the service tests need a real PostgreSQL server)")
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/service.db"
    import psycopg

    pg: TemporaryPostgres = request.getfixturevalue("postgres")
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg.url.rsplit("/", 1)[0] + "/" + name
