"""The rollout service: batches of rollouts over HTTP, a database (SQLite embedded, or
PostgreSQL for many machines) as queue and store, workers on any number of machines, GEPA jobs.

    rollouts service serve --workers 2                      # API + 2 local workers, embedded DB
    rollouts service worker --db postgresql://... --concurrency 64   # on any other machine

Modules: `store` (Store: connections, transactions in threads), `schema` (migrations),
`accounts` / `queue` / `jobs` (the SQL), `auth` (tokens), `api` (the Starlette app), `openapi`,
`execution` + `worker` (running tasks), `server` (serve: API + workers + GEPA jobs), `client`
(ServiceClient), `gepa_adapter` (GEPA over the service), `testing` (a throwaway PostgreSQL).

Needs the `service` extra: `pip install 'rollouts[service]'`.
"""

from rollouts.service.store import Store, default_db_url

__all__ = ["Store", "default_db_url"]
