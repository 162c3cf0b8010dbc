"""Core frozen types: endpoints, messages and their content blocks, tools, trajectories, state.

Every type here is a frozen dataclass, frozen all the way down: sequence fields are tuples, and
the dicts a caller passes (tool arguments and parameters, message details, trajectory metadata,
endpoint settings) are copied on the way in into read-only `FrozenDict`/`FrozenList` values
(`rollouts.frozen`) that still compare equal to, and serialize like, plain dicts and lists.
"Changing" a value means `dataclasses.replace`. Every persisted type has `to_dict()` /
`from_dict()` that round-trip through JSON to an equal object; `to_dict()` returns plain,
mutable dicts and lists.
"""

from __future__ import annotations

import enum
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from rollouts.frozen import FrozenDict, thaw
from rollouts.redaction import redact_json, redact_secret_fields, register_endpoint_secrets

if TYPE_CHECKING:
    from rollouts.environments.base import Environment
    from rollouts.eval.config import EvalConfig as EvalConfig
    from rollouts.eval.sample import Metric as Metric
    from rollouts.eval.sample import Sample as Sample
    from rollouts.eval.sample import Score as Score
    from rollouts.run_config import RunConfig as RunConfig

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """Drop keys whose value is None so persisted JSON stays small and stable."""
    return {k: v for k, v in d.items() if v is not None}


def _freeze_field(obj: object, name: str, optional: bool = False) -> None:
    """Replace the mapping in field `name` of a frozen dataclass by a deep read-only copy (a
    TypeError naming the field if it is not a mapping)."""
    value = getattr(obj, name)
    if type(value) is FrozenDict or (optional and value is None):
        return
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{type(obj).__name__}.{name} must be a mapping (a dict){' or None' if optional else ''}, "
            f"got {type(value).__name__}"
        )
    object.__setattr__(obj, name, FrozenDict(value))


_D = TypeVar("_D")


def evolve(obj: _D, **changes: Any) -> _D:
    """`dataclasses.replace` for the frozen types here, without its per-call field
    introspection (the agent loop makes a dozen new states per turn). Runs `__post_init__`,
    so a new value is checked and frozen like a constructed one."""
    assert changes.keys() <= obj.__dict__.keys(), f"unknown fields {set(changes) - set(obj.__dict__)}"
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    post = getattr(new, "__post_init__", None)
    if post is not None:
        post()
    return new


# --------------------------------------------------------------------------------------------
# Endpoint
# --------------------------------------------------------------------------------------------

_SECRET_FIELDS = ("api_key", "oauth_token")
DEFAULT_MAX_TOKENS = 4096  # Endpoint.max_tokens' default; the embedded models read it as their own default


@dataclass(frozen=True)
class Endpoint:
    """Which model to call and how.

    `api_key` and `oauth_token` (an Anthropic OAuth access token, sent as a bearer token
    instead of the key) are never printed (`repr`) and never emitted by `to_dict()` unless
    `exclude_secrets=False` is passed explicitly; both are masked like keys in everything this
    process prints or writes (`rollouts.redaction`). `transport` selects how OpenAI-compatible
    servers are reached: `"sdk"` (the official SDK), `"http"` (our lean httpx transport) or
    `"auto"` (the default: the lean transport for self-hosted servers — `openai-compatible`,
    `vllm`, `sglang`, `llamacpp`, `local` — and the SDK for `openai`).
    `max_tokens` left at its default (4096) means, for the embedded `local` models (whose whole
    context is 4096 tokens), that model's own default (1024: a looping small model cannot
    generate for minutes); any other value is used as given.
    """

    provider: str
    model: str
    api_base: str = ""
    api_key: str = field(default="", repr=False)
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    thinking: Mapping[str, Any] | None = None
    max_retries: int = 3
    timeout: float = 120.0
    extra_params: Mapping[str, Any] | None = None
    transport: Literal["auto", "sdk", "http"] = "auto"
    oauth_token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.provider:
            raise ValueError("Endpoint.provider must be set, e.g. 'anthropic', 'openai', 'local'")
        if not self.model:
            raise ValueError("Endpoint.model must be set, e.g. 'claude-sonnet-4-5'")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(
                f"Endpoint.max_tokens must be a positive whole number of tokens (e.g. 4096), got {self.max_tokens!r}"
            )
        if self.max_retries < 0:
            raise ValueError(f"Endpoint.max_retries must be >= 0, got {self.max_retries}")
        if self.timeout <= 0:
            raise ValueError(f"Endpoint.timeout must be > 0 seconds, got {self.timeout}")
        if self.transport not in ("auto", "sdk", "http"):
            raise ValueError(f"Endpoint.transport must be 'auto', 'sdk' or 'http', got {self.transport!r}")
        _freeze_field(self, "thinking", optional=True)
        _freeze_field(self, "extra_params", optional=True)
        if self.api_key or self.oauth_token or self.extra_params or self.api_base:
            register_endpoint_secrets(self)  # a key this process has seen is never printed or written

    def to_dict(self, exclude_secrets: bool = True) -> dict[str, Any]:
        """A JSON-ready dict. With the default `exclude_secrets=True` it has no `api_key` or
        `oauth_token` key, and
        secret-looking `extra_params` fields (headers with a key, ...) and `api_base` credentials
        read `[redacted]` (`rollouts.redaction.redact_secret_fields`)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if exclude_secrets:
            for name in _SECRET_FIELDS:
                d.pop(name, None)
        d["thinking"] = thaw(self.thinking)
        d["extra_params"] = thaw(self.extra_params)
        if exclude_secrets:  # one rule for every output: headers holding a key, URL credentials
            d["api_base"] = redact_secret_fields(d["api_base"])
            d["extra_params"] = redact_secret_fields(d["extra_params"])
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], api_key: str = "", oauth_token: str = "") -> Endpoint:
        """The Endpoint `to_dict` described, with `api_key` and `oauth_token` supplied separately
        (a value given here wins over one in `data`; unknown keys are a ValueError naming them)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"Endpoint.from_dict: unknown keys {sorted(unknown)}")
        kwargs = {k: v for k, v in data.items() if k not in _SECRET_FIELDS}
        return cls(
            **kwargs,
            api_key=api_key or data.get("api_key", ""),
            oauth_token=oauth_token or data.get("oauth_token", ""),
        )


# --------------------------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """Token counts and cost of one model call (or a sum of several)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        """Input + output + cache read + cache write tokens (reasoning is part of output)."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        return cls(**data)


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: a name, a description and a JSON-schema for its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        _freeze_field(self, "parameters")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": thaw(self.parameters)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tool:
        return cls(name=data["name"], description=data["description"], parameters=data["parameters"])


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. `parse_error` is set when its arguments were not valid JSON.

    `arguments` is a read-only copy of what was passed (a FrozenDict): a tool cannot change
    the call it was given, nor the assistant message that holds it."""

    id: str
    name: str
    arguments: Mapping[str, Any]
    raw_arguments: str | None = None
    parse_error: str | None = None

    def __post_init__(self) -> None:
        _freeze_field(self, "arguments")

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "id": self.id,
                "name": self.name,
                "arguments": thaw(self.arguments),
                "raw_arguments": self.raw_arguments,
                "parse_error": self.parse_error,
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(
            id=data["id"],
            name=data["name"],
            arguments=data.get("arguments", {}),
            raw_arguments=data.get("raw_arguments"),
            parse_error=data.get("parse_error"),
        )


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned. `is_error` results are sent back to the model like any other."""

    tool_call_id: str
    content: str
    is_error: bool = False
    stop_reason: StopReason | None = None
    details: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _freeze_field(self, "details", optional=True)

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "tool_call_id": self.tool_call_id,
                "content": self.content,
                "is_error": self.is_error,
                "stop_reason": self.stop_reason.value if self.stop_reason else None,
                "details": thaw(self.details),
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolResult:
        sr = data.get("stop_reason")
        return cls(
            tool_call_id=data["tool_call_id"],
            content=data["content"],
            is_error=data.get("is_error", False),
            stop_reason=StopReason(sr) if sr else None,
            details=data.get("details"),
        )


# --------------------------------------------------------------------------------------------
# Content blocks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextContent:
    """Plain text in a message."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ThinkingContent:
    """Model reasoning. `signature` must be sent back verbatim to the provider that made it;
    `redacted` blocks carry opaque `data` instead of text. `provider` records the origin so
    history can be transformed when a conversation moves to another provider."""

    thinking: str
    signature: str | None = None
    redacted: bool = False
    data: str | None = None
    provider: str | None = None
    type: Literal["thinking"] = "thinking"


@dataclass(frozen=True)
class ToolCallContent(ToolCall):
    """A tool call inside an assistant message: a ToolCall (the same fields, declared once)
    that is also a content block (`type`). As a dataclass it equals only another
    ToolCallContent; `to_tool_call()` gives the plain ToolCall."""

    type: Literal["tool_call"] = "tool_call"

    def to_tool_call(self) -> ToolCall:
        """This block as a plain ToolCall."""
        return ToolCall(self.id, self.name, self.arguments, self.raw_arguments, self.parse_error)

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallContent:
        """The content block holding `call`."""
        return cls(call.id, call.name, call.arguments, call.raw_arguments, call.parse_error)


@dataclass(frozen=True)
class ImageContent:
    """An image, either inline (`data` base64 with `media_type`) or by `url`."""

    media_type: str = "image/png"
    data: str | None = None
    url: str | None = None
    type: Literal["image"] = "image"

    def __post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise ValueError("ImageContent needs exactly one of `data` (base64) or `url`")


ContentBlock: TypeAlias = TextContent | ThinkingContent | ToolCallContent | ImageContent
_BLOCK_CLASSES = (TextContent, ThinkingContent, ToolCallContent, ImageContent)


_BLOCK_TYPE_SET = frozenset(_BLOCK_CLASSES)


def _content_error(content: object) -> str:
    return (
        f'Message.content must be a str ("" for no text) or a tuple of content blocks '
        f"(TextContent, ThinkingContent, ToolCallContent, ImageContent), got {_describe(content)}"
    )


def _describe(value: object) -> str:
    if isinstance(value, tuple):
        bad = next((b for b in value if not isinstance(b, _BLOCK_CLASSES)), None)
        return f"a tuple holding a {type(bad).__name__} ({bad!r:.60})"
    return f"{type(value).__name__} ({value!r:.60})"


_BLOCK_TYPES: dict[str, type] = {
    "text": TextContent,
    "thinking": ThinkingContent,
    "tool_call": ToolCallContent,
    "image": ImageContent,
}


def block_to_dict(block: ContentBlock) -> dict[str, Any]:
    """A content block as a JSON-ready dict (its `type` says which block it is)."""
    d = {f.name: getattr(block, f.name) for f in fields(block)}
    if isinstance(block, ToolCallContent):
        d["arguments"] = thaw(block.arguments)
    return _clean(d)


def block_from_dict(data: Mapping[str, Any]) -> ContentBlock:
    """The content block `block_to_dict` made; an unknown `type` is a ValueError."""
    try:
        cls = _BLOCK_TYPES[data["type"]]
    except KeyError:
        raise ValueError(f"unknown content block type {data.get('type')!r}") from None
    result: ContentBlock = cls(**data)
    return result


# --------------------------------------------------------------------------------------------
# Message
# --------------------------------------------------------------------------------------------


_second: tuple[int, str] = (-1, "")  # the last whole second formatted (one assignment: thread-safe)


def now_iso() -> str:
    """Current UTC time as an ISO-8601 string with microseconds."""
    global _second
    t = time.time()
    whole = int(t)
    second, prefix = _second
    if whole != second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, prefix)
    return f"{prefix}.{int((t - whole) * 1e6):06d}Z"


@dataclass(frozen=True)
class Message:
    """One message of a conversation.

    `content` is a plain string or a tuple of content blocks. Assistant messages made by a
    provider carry `provider`, `model` and `usage`; tool results carry `tool_call_id`, and
    their `details` say which tool answered (`tool_name`), whether it failed (`is_error`) and
    what else the tool reported (`result`): read them through the properties of the same names
    and build them with `Message.tool_result`.
    """

    role: Role
    content: str | tuple[ContentBlock, ...]
    tool_call_id: str | None = None
    timestamp: str | None = None
    provider: str | None = None
    model: str | None = None
    usage: Usage | None = None
    details: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"Message.role must be one of {_ROLES}, got {self.role!r}")
        content = self.content
        if type(content) is not str:
            if isinstance(content, list):
                content = tuple(content)
                object.__setattr__(self, "content", content)
            if not isinstance(content, tuple):
                raise TypeError(_content_error(content))
            for b in content:  # a loop, not all(...): messages are made (and loaded) by the thousand
                if type(b) not in _BLOCK_TYPE_SET and not isinstance(b, _BLOCK_CLASSES):
                    raise TypeError(_content_error(content))
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        details = self.details
        if details is not None and type(details) is not FrozenDict:
            _freeze_field(self, "details", optional=True)

    @classmethod
    def tool_result(
        cls,
        call: ToolCall,
        content: str,
        *,
        is_error: bool = False,
        result_details: Mapping[str, Any] | None = None,
        timestamp: str | None = None,
    ) -> Message:
        """The tool message answering `call`: its text, whether it is an error and the tool's
        own details (stored as `details["result"]`)."""
        details: dict[str, Any] = {"tool_name": call.name}
        if is_error:
            details["is_error"] = True
        if result_details:
            details["result"] = result_details
        return cls("tool", content, tool_call_id=call.id, timestamp=timestamp, details=details)

    @property
    def is_error(self) -> bool:
        """Whether this is a tool message reporting a failure (unknown tool, bad arguments, a
        denied call, a tool that raised or returned an error result)."""
        return self.role == "tool" and bool(self.details and self.details.get("is_error"))

    @property
    def tool_name(self) -> str | None:
        """For a tool message, the name of the tool that answered (None if not recorded)."""
        name = self.details.get("tool_name") if (self.role == "tool" and self.details) else None
        return str(name) if name is not None else None

    @property
    def tool_details(self) -> Mapping[str, Any] | None:
        """For a tool message, the details its tool reported (`ToolResult.details`), if any."""
        result = self.details.get("result") if (self.role == "tool" and self.details) else None
        return result if isinstance(result, Mapping) else None

    @property
    def blocks(self) -> tuple[ContentBlock, ...]:
        """Content as blocks (a plain string becomes one TextContent)."""
        if isinstance(self.content, str):
            return (TextContent(self.content),) if self.content else ()
        return self.content

    @property
    def text(self) -> str:
        """All text blocks joined (thinking and tool calls excluded)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextContent))

    def get_tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls of this message, in order (empty for plain-string content)."""
        if isinstance(self.content, str):
            return ()
        return tuple(b.to_tool_call() for b in self.content if isinstance(b, ToolCallContent))

    def to_dict(self) -> dict[str, Any]:
        content: Any = self.content if isinstance(self.content, str) else [block_to_dict(b) for b in self.content]
        return _clean(
            {
                "role": self.role,
                "content": content,
                "tool_call_id": self.tool_call_id,
                "timestamp": self.timestamp,
                "provider": self.provider,
                "model": self.model,
                "usage": self.usage.to_dict() if self.usage else None,
                "details": thaw(self.details),
            }
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        raw = data.get("content", "")
        content: str | tuple[ContentBlock, ...]
        if raw is None:
            content = ""
        elif isinstance(raw, str):
            content = raw
        else:
            content = tuple(block_from_dict(b) for b in raw)
        usage = data.get("usage")
        return cls(
            role=data["role"],
            content=content,
            tool_call_id=data.get("tool_call_id"),
            timestamp=data.get("timestamp"),
            provider=data.get("provider"),
            model=data.get("model"),
            usage=Usage.from_dict(usage) if usage else None,
            details=data.get("details"),
        )


# --------------------------------------------------------------------------------------------
# Trajectory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRecord:
    """The token-exact record of one model call (`RunConfig.use_tito`): the prompt the model was
    given as token ids, the ids it sampled, and the sampler's log-probability of each sampled id
    (under the distribution it sampled from). A trainer reads these instead of re-tokenising
    text, which can silently change what was sampled."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "completion_ids", "logprobs"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"TokenRecord: {len(self.completion_ids)} completion ids but {len(self.logprobs)} log-probs"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "logprobs": list(self.logprobs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenRecord:
        return cls(tuple(data["prompt_ids"]), tuple(data["completion_ids"]), tuple(data["logprobs"]))


@dataclass(frozen=True)
class Completion:
    """Bookkeeping of one model call: which model, why it finished, how long it took.

    Token usage lives on the assistant `Message` it produced (`message_index`). `tokens` is
    set by token-exact providers (`RunConfig.use_tito`); `raw_request`/`raw_response` (the
    request as sent and the raw stream items, masked and size-bounded) only when the run
    records them (`RunConfig.record_raw`, see `rollouts.providers.raw`)."""

    provider: str
    model: str
    finish_reason: str | None = None
    message_index: int = -1
    duration_s: float = 0.0
    time_to_first_token_s: float | None = None
    attempts: int = 1
    tokens: TokenRecord | None = None
    raw_request: str | None = None
    raw_response: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = _clean({f.name: getattr(self, f.name) for f in fields(self)})
        if self.tokens is not None:
            d["tokens"] = self.tokens.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Completion:
        tokens = data.get("tokens")
        if tokens is None:
            return cls(**data)
        return cls(**{**data, "tokens": TokenRecord.from_dict(tokens)})


@dataclass(frozen=True)
class Trajectory:
    """A conversation plus per-call records, a reward and free-form metadata."""

    messages: tuple[Message, ...] = ()
    completions: tuple[Completion, ...] = ()
    rewards: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.messages, list):
            object.__setattr__(self, "messages", tuple(self.messages))
        if isinstance(self.completions, list):
            object.__setattr__(self, "completions", tuple(self.completions))
        _freeze_field(self, "metadata")

    def append(self, *messages: Message) -> Trajectory:
        """A new trajectory with `messages` appended."""
        return evolve(self, messages=self.messages + messages)

    def total_usage(self) -> Usage:
        """The sum of the Usage of every message that has one (the assistant messages)."""
        total = Usage()
        for m in self.messages:
            if m.usage is not None:
                total = total + m.usage
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": [m.to_dict() for m in self.messages],
            "completions": [c.to_dict() for c in self.completions],
            "rewards": self.rewards,
            "metadata": thaw(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        return cls(
            messages=tuple(Message.from_dict(m) for m in data.get("messages", ())),
            completions=tuple(Completion.from_dict(c) for c in data.get("completions", ())),
            rewards=data.get("rewards", 0.0),
            metadata=data.get("metadata", {}),
        )

    def to_jsonl(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_jsonl(cls, line: str) -> Trajectory:
        """The trajectory `to_jsonl` wrote."""
        return cls.from_dict(json.loads(line))

    @staticmethod
    def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> None:
        """Write one trajectory per line (overwrites `path`), known secrets masked
        (`rollouts.redaction`)."""
        with open(path, "w", encoding="utf-8") as f:
            for t in trajectories:
                f.write(redact_json(t.to_jsonl()))
                f.write("\n")

    @staticmethod
    def load_jsonl(path: str | Path) -> list[Trajectory]:
        """Every trajectory of a file `save_jsonl` wrote."""
        return list(Trajectory.load_jsonl_streaming(path))

    @staticmethod
    def load_jsonl_streaming(path: str | Path) -> Iterator[Trajectory]:
        """Yield trajectories one line at a time without reading the whole file."""
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield Trajectory.from_jsonl(line)
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}:{lineno}: not a trajectory line: {e}") from e

    def hash(self) -> str:
        """A stable content hash (sha256 hex) of messages and metadata, ignoring timestamps."""
        msgs = []
        for m in self.messages:
            d = m.to_dict()
            d.pop("timestamp", None)
            msgs.append(d)
        payload = json.dumps(
            {"messages": msgs, "metadata": self.metadata},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
            default=str,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Actor, stop reasons, agent state
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Actor:
    """The model side of an agent: its conversation, its endpoint and the tools it sees."""

    trajectory: Trajectory
    endpoint: Endpoint
    tools: tuple[Tool, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.tools, list):
            object.__setattr__(self, "tools", tuple(self.tools))


class StopReason(enum.StrEnum):
    """Why a run stopped."""

    MAX_TURNS = "max_turns"
    BUDGET_EXCEEDED = "budget_exceeded"
    TASK_COMPLETED = "task_completed"
    NO_TOOL_CALLED = "no_tool_called"
    TOOL_ERROR = "tool_error"
    ABORTED = "aborted"
    PROVIDER_ERROR = "provider_error"
    CONTEXT_TOO_LONG = "context_too_long"
    EMPTY_MESSAGE = "empty_message"
    USER_EXIT = "user_exit"


@dataclass(frozen=True)
class AgentState:
    """Everything a run needs to continue: the actor, the environment and loop bookkeeping.

    `pending_tool_calls[next_tool_idx:]` are the calls of the last assistant message that have
    not been answered yet; a run resumes there after an interruption."""

    actor: Actor
    environment: Environment | None = None
    stop: StopReason | None = None
    turn_idx: int = 0
    pending_tool_calls: tuple[ToolCall, ...] = ()
    next_tool_idx: int = 0
    session_id: str | None = None
    parent_session_id: str | None = None
    branch_point: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pending_tool_calls, list):
            object.__setattr__(self, "pending_tool_calls", tuple(self.pending_tool_calls))
        if not 0 <= self.next_tool_idx <= len(self.pending_tool_calls):
            raise ValueError(
                f"AgentState.next_tool_idx {self.next_tool_idx} is out of range for "
                f"{len(self.pending_tool_calls)} pending tool calls (0..{len(self.pending_tool_calls)})"
            )

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation so far (the actor's trajectory's messages)."""
        return self.actor.trajectory.messages

    def with_messages(self, *messages: Message) -> AgentState:
        """A new state whose trajectory has `messages` appended."""
        actor = evolve(self.actor, trajectory=self.actor.trajectory.append(*messages))
        return evolve(self, actor=actor)


# Handler type aliases (the callables RunConfig holds are defined in rollouts.run_config).
StopHandler: TypeAlias = Callable[[AgentState], AgentState]


# The evaluation and run-configuration types, importable from here as in the original rollouts
# (`from rollouts.dtypes import EvalConfig, RunConfig, Metric, Score`): they live in
# rollouts.eval and rollouts.run_config, which import this module, so they are looked up when
# first asked for.
_ELSEWHERE = {
    "EvalConfig": "rollouts.eval.config",
    "Metric": "rollouts.eval.sample",
    "Score": "rollouts.eval.sample",
    "Sample": "rollouts.eval.sample",
    "RunConfig": "rollouts.run_config",
}


def __getattr__(name: str) -> Any:
    module = _ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rollouts.dtypes' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
