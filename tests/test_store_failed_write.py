"""Issue 33 item 4: `append_messages` is all or none on a failed write. Under a file size limit
(`RLIMIT_FSIZE`, as a full disk would), the first message of a batch stayed in the log and a
retry of the batch raised SessionConflictError. A failed write is cut back to where it began.

The limit is set in a child process (it is per process, and would cut this one's own files)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    import trio
    from rollouts import Endpoint, Message
    from rollouts.store import FileSessionStore, SessionError

    async def main(root: str) -> None:
        store = FileSessionStore(root)
        session = await store.create(endpoint=Endpoint("scripted", "x"))
        sid = session.session_id
        await store.append_messages(sid, [Message("user", "hello")], expected_count=0)
        log = os.path.join(root, sid, "messages.jsonl")
        size = os.path.getsize(log)
        batch = [Message("assistant", "a" * 100), Message("user", "b" * 5000)]
        # room for the first message of the batch, not for the second
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 300, resource.RLIM_INFINITY))
        errors = []
        for _ in range(2):  # the failed batch, then its retry under the same limit
            try:
                await store.append_messages(sid, batch, expected_count=1)
            except SessionError as e:
                errors.append(type(e).__name__ + ": " + str(e))
        after_failure = os.path.getsize(log)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        await store.append_messages(sid, batch, expected_count=1)  # the retry, with room again
        _, messages = await store.get(sid)
        print(json.dumps({
            "size": size, "after_failure": after_failure, "errors": errors,
            "texts": [m.text[:5] for m in messages],
        }))

    trio.run(main, sys.argv[1])
    """
)


def test_append_messages_failed_write_leaves_nothing_and_can_be_retried(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "sessions")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["after_failure"] == out["size"]  # nothing of the failed batch stayed
    assert len(out["errors"]) == 2 and all(e.startswith("SessionError: cannot append") for e in out["errors"])
    assert out["texts"] == ["hello", "aaaaa", "bbbbb"]
