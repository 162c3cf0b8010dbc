"""The service's schema, as numbered migrations shared by SQLite and PostgreSQL.

Each migration is a list of statements with `{float}` / `{bigint}` type placeholders filled
in per dialect. `migrate()` applies the ones a database lacks, in order, each in its own
transaction, recording them in `schema_migrations`; running it again (or from several
processes at once) is harmless.

Times are epoch seconds (the database's clock for leases); JSON documents (endpoint specs,
task inputs, results with the `Trajectory` JSON, GEPA configs and checkpoints) are TEXT.
"""

from __future__ import annotations

from rollouts.service._db import Database, Tx

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

MIGRATIONS: list[list[str]] = [
    # 1: the first schema
    [
        """CREATE TABLE IF NOT EXISTS workspaces (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            created_at {float} NOT NULL
        )""",
        # Only the SHA-256 of a token is kept (tokens are 256-bit random: a slow hash adds nothing).
        """CREATE TABLE IF NOT EXISTS tokens (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            name TEXT NOT NULL DEFAULT '',
            token_hash TEXT NOT NULL UNIQUE,
            created_at {float} NOT NULL,
            expires_at {float},
            revoked_at {float}
        )""",
        """CREATE TABLE IF NOT EXISTS agents (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            name TEXT NOT NULL,
            active_version INTEGER,
            created_at {float} NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS agents_workspace ON agents(workspace_id, created_at)",
        """CREATE TABLE IF NOT EXISTS agent_versions (
            agent_id TEXT NOT NULL REFERENCES agents(id),
            version INTEGER NOT NULL,
            endpoint TEXT NOT NULL,
            environment TEXT,
            system_prompt TEXT NOT NULL DEFAULT '',
            max_turns INTEGER NOT NULL,
            tags TEXT NOT NULL DEFAULT '[]',
            source TEXT NOT NULL DEFAULT 'api',
            parent_version INTEGER,
            created_at {float} NOT NULL,
            PRIMARY KEY (agent_id, version)
        )""",
        """CREATE TABLE IF NOT EXISTS batches (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            agent_id TEXT NOT NULL REFERENCES agents(id),
            agent_version INTEGER NOT NULL,
            system_prompt TEXT NOT NULL,
            config TEXT NOT NULL,
            task_count INTEGER NOT NULL,
            parallelism INTEGER NOT NULL,
            timeout_per_task_ms {bigint} NOT NULL,
            idempotency_key TEXT,
            cancelled_at {float},
            deadline_at {float} NOT NULL,
            created_at {float} NOT NULL,
            UNIQUE (workspace_id, idempotency_key)
        )""",
        "CREATE INDEX IF NOT EXISTS batches_workspace ON batches(workspace_id, created_at)",
        # One row per task: the queue entry and, once finished, its result. (batch_id, task_id)
        # is the key, so a result is recorded once however many workers finish the task.
        """CREATE TABLE IF NOT EXISTS tasks (
            batch_id TEXT NOT NULL REFERENCES batches(id),
            task_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            input TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            lease_owner TEXT,
            lease_expires_at {float},
            queued_at {float} NOT NULL,
            started_at {float},
            finished_at {float},
            execution_time_ms {bigint},
            error TEXT,
            result TEXT,
            PRIMARY KEY (batch_id, task_id)
        )""",
        "CREATE INDEX IF NOT EXISTS tasks_queued ON tasks(status, queued_at, seq)",
        "CREATE INDEX IF NOT EXISTS tasks_lease ON tasks(lease_owner, status)",
        """CREATE TABLE IF NOT EXISTS gepa_jobs (
            id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            agent_id TEXT NOT NULL REFERENCES agents(id),
            base_version INTEGER NOT NULL,
            config TEXT NOT NULL,
            status TEXT NOT NULL,
            metric_calls INTEGER NOT NULL DEFAULT 0,
            max_metric_calls INTEGER NOT NULL,
            best_score {float},
            best_prompt TEXT,
            candidates INTEGER NOT NULL DEFAULT 0,
            lineage TEXT,
            checkpoint TEXT,
            created_version INTEGER,
            promote INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            lease_owner TEXT,
            lease_expires_at {float},
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            created_at {float} NOT NULL,
            completed_at {float}
        )""",
        "CREATE INDEX IF NOT EXISTS gepa_jobs_workspace ON gepa_jobs(workspace_id, created_at)",
    ],
    # 2: a batch's tasks by status (the claim counts a batch's running tasks; progress counts all)
    # (replaced by migration 5)
    [
        "CREATE INDEX IF NOT EXISTS tasks_batch_status ON tasks(batch_id, status)",
    ],
    # 3: the UI pages a batch's tasks in their order (rollouts.service.catalog)
    [
        "CREATE INDEX IF NOT EXISTS tasks_batch_seq ON tasks(batch_id, seq)",
    ],
    # 4: a result's reward, tokens, turns and cost as columns (written by queue.finish), so the
    # UI sorts a batch's tasks by them without parsing every result's JSON; older rows have
    # NULLs and the UI reads their JSON instead
    [
        "ALTER TABLE tasks ADD COLUMN reward {float}",
        "ALTER TABLE tasks ADD COLUMN tokens {bigint}",
        "ALTER TABLE tasks ADD COLUMN turns INTEGER",
        "ALTER TABLE tasks ADD COLUMN cost_usd {float}",
        "CREATE INDEX IF NOT EXISTS tasks_batch_reward ON tasks(batch_id, reward)",
    ],
    # 5: a claim takes a batch's first queued tasks in order: with (batch_id, status) alone it
    # read and sorted every queued task of the batch to take 32 (O(queue) per claim, 4 ms with
    # 5,000 queued on PostgreSQL); (batch_id, status, seq) hands them over in order. It serves
    # every query the index it replaces served.
    [
        "CREATE INDEX IF NOT EXISTS tasks_batch_status_seq ON tasks(batch_id, status, seq)",
        "DROP INDEX IF EXISTS tasks_batch_status",
    ],
    # 6: the digest of the request that made a batch with an idempotency key: a retry (the same
    # body) gets the batch, the key reused for another request a 409
    [
        "ALTER TABLE batches ADD COLUMN request_digest TEXT",
    ],
    # 7: the web UI's sign-in sessions (rollouts.service.ui_sessions): the cookie holds a session
    # id, revocable and expiring, instead of the long-lived API token
    [
        """CREATE TABLE IF NOT EXISTS ui_sessions (
            id_hash TEXT PRIMARY KEY,
            token_id TEXT NOT NULL REFERENCES tokens(id),
            workspace_id TEXT NOT NULL REFERENCES workspaces(id),
            created_at {float} NOT NULL,
            expires_at {float} NOT NULL,
            ended_at {float}
        )""",
        "CREATE INDEX IF NOT EXISTS ui_sessions_expires ON ui_sessions(expires_at)",
    ],
    # 8: what a GEPA job says about how it ended beside its status (no version when nothing
    # improved on the seed; tasks that timed out)
    [
        "ALTER TABLE gepa_jobs ADD COLUMN message TEXT",
    ],
]

SCHEMA_VERSION = len(MIGRATIONS)


def _applied(tx: Tx) -> set[int]:
    tx.execute(
        f"CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at {tx.dialect.float_type})"
    )
    return {int(r[0]) for r in tx.execute("SELECT version FROM schema_migrations")}


def migrate(db: Database) -> int:
    """Apply the migrations `db` lacks; returns the schema version. Safe to run concurrently."""
    for number, statements in enumerate(MIGRATIONS, 1):

        def apply(tx: Tx, number: int = number, statements: list[str] = statements) -> None:
            if tx.dialect.is_postgres:  # one migrator at a time across processes
                tx.execute("SELECT pg_advisory_xact_lock(4242015)")
            if number in _applied(tx):
                return
            for statement in statements:
                tx.execute(statement.format(float=tx.dialect.float_type, bigint=tx.dialect.bigint))
            tx.execute(
                f"INSERT INTO schema_migrations (version, applied_at) VALUES (?, {tx.dialect.now})",
                (number,),
            )

        db.run(apply)
    return SCHEMA_VERSION
