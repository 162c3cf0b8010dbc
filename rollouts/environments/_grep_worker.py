"""File walking and the `grep` search of CodingEnvironment, standard library only.

`grep` runs this file as its own process (`python -I -S _grep_worker.py '<json>'`): Python's `re`
holds the GIL for a whole match, so a model's pattern that backtracks catastrophically, e.g.
`(a+)+$`, would freeze the event loop and every other sample with it, and no thread can be
stopped. A process can: `run_command` kills it at its timeout or on cancellation. The output
is one JSON object: {"hits": ["path:line: text", ...], "more": bool} or {"error": "too_many_files"}.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
from collections.abc import Collection
from pathlib import Path


class TooManyFiles(Exception):
    """More files under the searched directory than the limit."""


def walk_files(root: str, base: str | Path, skip_dirs: Collection[str], max_files: int) -> list[Path]:
    """Files under `base` (skipping `skip_dirs` and links that leave `root`, a real path), in
    sorted order; TooManyFiles when there are more than `max_files`."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for f in sorted(filenames):
            full = Path(dirpath) / f
            real = os.path.realpath(full)
            if real == root or real.startswith(root + os.sep):
                files.append(full)
                if len(files) > max_files:
                    raise TooManyFiles
    return files


def search(args: dict[str, object]) -> dict[str, object]:
    """Run one search described by `args` (see CodingEnvironment.grep)."""
    root = str(args["root"])
    base = Path(str(args["base"]))
    regex = re.compile(str(args["pattern"]), re.IGNORECASE if args["ignore_case"] else 0)
    include = args.get("include")
    max_hits = int(args["max_hits"])  # type: ignore[call-overload]
    max_file_bytes = int(args["max_file_bytes"])  # type: ignore[call-overload]
    try:
        files = [base] if base.is_file() else walk_files(root, base, set(args["skip_dirs"]), int(args["max_files"]))  # type: ignore[call-overload]
    except TooManyFiles:
        return {"error": "too_many_files"}
    hits: list[str] = []
    for f in files:
        if include and not fnmatch.fnmatch(f.name, str(include)):
            continue
        try:
            if f.stat().st_size > max_file_bytes:
                continue
            data = f.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue
        rel = os.path.relpath(f, root)
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                hits.append(f"{rel}:{n}: {line[:300]}")
                if len(hits) > max_hits:
                    return {"hits": hits[:max_hits], "more": True}
    return {"hits": hits, "more": False}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(search(json.loads(sys.argv[1]))))
