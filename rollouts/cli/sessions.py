"""`rollouts sessions`: list, show, tree, branch and export the recorded sessions.

Sessions live in `--sessions-dir` (default `$ROLLOUTS_SESSIONS_DIR`, rollouts.toml, or
~/.rollouts/sessions). Nothing here changes a session except `branch`, which adds a new one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rollouts.cli import session_view
from rollouts.cli.common import CLIError, HelpFormatter, add_sessions_dir_arg, get_config, sessions_dir
from rollouts.cli.render import _one_line, use_color
from rollouts.redaction import redact_json, redact_text
from rollouts.store import (
    AgentSession,
    FileSessionStore,
    SessionCorruptError,
    SessionError,
    SessionNotFoundError,
    SessionRecoveryWarning,
    SessionStatus,
)

EXAMPLES = """\
examples:
  rollouts sessions list                                  # the 20 newest sessions
  rollouts sessions list --status aborted --tag source=cli --limit 50
  rollouts sessions show ID                               # every message, thinking and tool call
  rollouts sessions tree ID                               # the session with its branches
  rollouts sessions branch ID --at 4                      # a new session keeping messages 0..3
  rollouts run --session NEW_ID -p "try it another way"   # ... and continue it
  rollouts sessions export ID --format html -o chat.html
  rollouts sessions export ID --format jsonl | jq .role

a branch keeps the first N messages of its parent (read through the parent, never copied) and
the environment as it was at that point. Sessions are stored without API keys.

exit status: 0 done, 1 a session is damaged, 2 usage error (unknown session, bad --at).
"""

_LIST_LIMIT = 20
_DAMAGED = "DAMAGED"

# each action's own examples (`rollouts sessions ACTION --help`)
_ACTION_EXAMPLES = {
    "list": """\
examples:
  rollouts sessions list                                  # the 20 newest sessions
  rollouts sessions list --status aborted --limit 0       # every aborted one
  rollouts sessions list --tag source=cli --json | jq -r .session_id
""",
    "show": """\
examples:
  rollouts sessions show ID
  rollouts sessions show ID | less -R
""",
    "tree": """\
examples:
  rollouts sessions tree ID                               # from the root session, every branch
""",
    "branch": """\
examples:
  rollouts sessions branch ID --at 4                      # prints the new session's id
  rollouts run --session NEW_ID -p "try it another way"   # ... then continue it
  rollouts sessions branch ID --at 2 --tag experiment=b   # tag the new session
""",
    "export": """\
examples:
  rollouts sessions export ID                             # Markdown on stdout
  rollouts sessions export ID --format html -o chat.html
  rollouts sessions export ID --format jsonl | jq .role
""",
}


def _action(actions: Any, name: str, common: argparse.ArgumentParser, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(
        name,
        parents=[common],
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        epilog=_ACTION_EXAMPLES[name],
        formatter_class=HelpFormatter,
    )
    return parser


def add_parser(sub: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_sessions_dir_arg(common)
    p: argparse.ArgumentParser = sub.add_parser(
        "sessions",
        help="list, show, branch and export recorded sessions",
        description="List, show, branch and export the sessions `rollouts run` (or run_agent with a store) recorded.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    ls = _action(actions, "list", common, "sessions, newest first")
    ls.add_argument("--status", action="append", choices=[s.value for s in SessionStatus], help="only this status")
    ls.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="only sessions with this tag")
    ls.add_argument(
        "--limit", type=int, default=_LIST_LIMIT, metavar="N", help="at most N (0: all; default %(default)s)"
    )
    ls.add_argument("--json", action="store_true", help="one JSON object per session")
    ls.set_defaults(func=main, run=_list)

    show = _action(actions, "show", common, "a session's messages")
    show.add_argument("session_id", metavar="ID")
    show.set_defaults(func=main, run=_show)

    tree = _action(actions, "tree", common, "a session and its branches")
    tree.add_argument("session_id", metavar="ID")
    tree.set_defaults(func=main, run=_tree)

    br = _action(actions, "branch", common, "a new session from the first N messages")
    br.add_argument("session_id", metavar="ID")
    br.add_argument("--at", type=int, required=True, metavar="N", help="keep messages 0..N-1 (0 keeps none)")
    br.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag for the new session")
    br.set_defaults(func=main, run=_branch)

    ex = _action(actions, "export", common, "write a session as Markdown, HTML or JSONL")
    ex.add_argument("session_id", metavar="ID")
    ex.add_argument("--format", choices=("md", "html", "jsonl"), default="md", help="(default: %(default)s)")
    ex.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    ex.set_defaults(func=main, run=_export)

    p.set_defaults(func=_no_action(p))
    return p


def _no_action(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return run


def _tags(items: list[str]) -> dict[str, str]:
    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--tag must look like KEY=VALUE, got {item!r}")
        tags[key] = value
    return tags


def _utf8() -> bool:
    return (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _summary(session: AgentSession, count: int, title: str) -> str:
    status = session.status.value
    return f"{status:<9} {count:>4} msgs  {title}".rstrip()


# --------------------------------------------------------------------------------------------
# actions
# --------------------------------------------------------------------------------------------


async def _list(store: FileSessionStore, args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise CLIError("--limit must be >= 0 (0 lists all)")
    found = await store.list(tags=_tags(args.tag), status=args.status, limit=args.limit or None)
    if not found and not args.json:
        print(f"no sessions in {store.root}" + (" match" if args.tag or args.status else ""), file=sys.stderr)
        return 0
    if not args.json:
        print(f"{'ID':<30} {'STATUS':<9} {'MSGS':>4}  {'MODEL':<28} {'BRANCH OF':<34} FIRST MESSAGE")
    for s in found:
        model = f"{s.endpoint.provider}/{s.endpoint.model}"
        branch = f"{s.parent_id}@{s.branch_point}" if s.parent_id else "-"
        try:
            count = await store.message_count(s.session_id)
            title = session_view.preview(await store.messages(s.session_id, limit=4))
        except SessionError as e:  # one damaged session must not hide the others: mark it
            if args.json:
                print(json.dumps({**s.to_dict(), "damaged": str(e)}, ensure_ascii=False, separators=(",", ":")))
            else:
                print(f"{s.session_id:<30} {_DAMAGED:<9} {'?':>4}  {_one_line(model, 28):<28} {branch:<34} {e}")
            continue
        if args.json:
            record = {**s.to_dict(), "message_count": count, "first_message": title}
            print(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
            continue
        print(f"{s.session_id:<30} {s.status.value:<9} {count:>4}  {_one_line(model, 28):<28} {branch:<34} {title}")
    return 0


async def _show(store: FileSessionStore, args: argparse.Namespace) -> int:
    session, messages = await store.get(args.session_id)
    sys.stdout.write(session_view.to_text(session, messages, color=use_color(sys.stdout), utf8=_utf8()))
    return 0


async def _tree(store: FileSessionStore, args: argparse.Namespace) -> int:
    root = await store.metadata(args.session_id)
    lines: list[str] = []
    for _ in range(10_000):
        if root.parent_id is None:
            break
        try:
            root = await store.metadata(root.parent_id)
        except SessionError as e:  # show what can be shown, from the oldest readable session
            lines.append(f"(branch of {root.parent_id}, which cannot be read: {e})")
            break
    children: dict[str, list[AgentSession]] = {}
    for s in reversed(await store.list()):  # oldest first; damaged ones are skipped with a warning
        if s.parent_id is not None:
            children.setdefault(s.parent_id, []).append(s)
    tee, last, bar = ("├── ", "└── ", "│   ") if _utf8() else ("|-- ", "`-- ", "|   ")

    async def line(s: AgentSession) -> str:
        mark = "  <- this one" if s.session_id == args.session_id else ""
        at = f"@{s.branch_point} " if s.branch_point is not None else ""
        try:
            count = await store.message_count(s.session_id)
            title = session_view.preview(await store.messages(s.session_id, limit=(s.branch_point or 0) + 4))
        except SessionError as e:  # one damaged session must not hide the rest of the tree
            return f"{at}{s.session_id}  {_DAMAGED}: {e}{mark}"
        return f"{at}{s.session_id}  {_summary(s, count, title)}{mark}"

    async def walk(s: AgentSession, prefix: str, connector: str) -> None:
        lines.append(prefix + connector + await line(s))
        kids = children.get(s.session_id, [])
        below = prefix + ("" if not connector else ("    " if connector == last else bar))
        for i, kid in enumerate(kids):
            await walk(kid, below, last if i == len(kids) - 1 else tee)

    await walk(root, "", "")
    print("\n".join(lines))
    return 0


async def _branch(store: FileSessionStore, args: argparse.Namespace) -> int:
    new = await store.branch(args.session_id, args.at, tags=_tags(args.tag))
    print(new.session_id)
    print(
        f"branched {args.session_id} at message {args.at}: {new.session_id}  "
        f"(continue: rollouts run --session {new.session_id})",
        file=sys.stderr,
    )
    return 0


async def _export(store: FileSessionStore, args: argparse.Namespace) -> int:
    session, messages = await store.get(args.session_id)
    if args.format == "md":
        text = session_view.to_markdown(session, messages)
    elif args.format == "html":
        text = session_view.to_html(session, messages)
    else:
        text = session_view.to_jsonl(messages)
    text = redact_json(redact_text(text))  # (stdout is guarded too; a file is not)
    if args.output:
        try:
            await trio.Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise CLIError(f"--output {args.output}: {e.strerror or e}") from None
        print(f"wrote {args.output} ({len(messages)} messages)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    store = FileSessionStore(sessions_dir(args, get_config()))
    run: Callable[[FileSessionStore, argparse.Namespace], Awaitable[int]] = args.run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SessionRecoveryWarning)
        try:
            code = trio.run(run, store, args)
        except BrokenPipeError:  # `rollouts sessions list | head`: the reader has what it wanted
            sys.stdout = open(os.devnull, "w")  # stays open until exit
            return 0
        except SessionNotFoundError as e:
            raise CLIError(str(e)) from None
        except SessionCorruptError as e:
            raise CLIError(str(e), exit_code=1) from None
        except SessionError as e:
            raise CLIError(str(e)) from None
        finally:
            for w in caught:
                if issubclass(w.category, SessionRecoveryWarning):
                    print(f"rollouts: warning: {w.message}", file=sys.stderr)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return code


__all__ = ["add_parser", "main"]
