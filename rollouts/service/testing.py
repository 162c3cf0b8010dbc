"""A throwaway PostgreSQL server for tests and benchmarks, from the system's binaries.

    with TemporaryPostgres(tmp_dir) as pg:
        store = await Store.open(pg.url)

`initdb` makes a cluster in a temporary directory and `pg_ctl` starts it on 127.0.0.1 on a free
port (its unix socket in the same directory), with fsync off (a test cluster needs no
durability across power loss). As root the binaries run as the `postgres` user, which owns
the directory. `stop()` shuts it down and deletes nothing else.

The binaries come from the distribution's package (Debian: `apt-get install -y postgresql`,
found under /usr/lib/postgresql/*/bin); when they are missing, `TemporaryPostgres` raises
`PostgresUnavailable` with that command.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path
from types import TracebackType

__all__ = ["INSTALL_HINT", "PostgresUnavailable", "TemporaryPostgres", "find_pg_bin"]

INSTALL_HINT = "apt-get install -y postgresql"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server binaries (initdb, pg_ctl) are not installed."""


def find_pg_bin() -> Path:
    """The directory with initdb and pg_ctl (the newest version installed)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0))
    for d in reversed(candidates):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    raise PostgresUnavailable(f"PostgreSQL's server binaries (initdb, pg_ctl) are not installed: run `{INSTALL_HINT}`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryPostgres:
    """A PostgreSQL cluster in `root` (see the module docstring). `url` connects to it."""

    def __init__(self, root: str | Path, *, user: str = "rollouts", database: str = "rollouts") -> None:
        self.bin = find_pg_bin()
        self.root = Path(root)
        self.data = self.root / "data"
        self.user = user
        self.database = database
        self.port = 0
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str) -> str:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def start(self) -> TemporaryPostgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.port = _free_port()
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w", "start")
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, self.database)
        return self

    def restart_stopped(self) -> None:
        """Start the cluster again after `stop()`, on the same port (clients reconnect to it)."""
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`mode` "fast": a clean shutdown, as a restart by an operator)."""
        if self.port and (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
