"""rollouts: run LLM agents as composable, reproducible rollouts.

Frozen state flows through `run_agent()` -> `run_agent_step()` -> `rollout()` +
`process_pending_tools()`; every step returns a new state. Providers stream granular events;
environments provide tools; `evaluate()` scores datasets; `optimize()` evolves prompts with GEPA.

The root holds the core, grouped by concept below. The rest lives in its own package, each with
its `__all__`: `rollouts.events` (every stream event), `rollouts.providers` (the registry, prices,
retry policy, client pooling), `rollouts.store` (sessions: FileSessionStore, resume_session),
`rollouts.gepa` (the engine, adapters, selectors, stoppers), `rollouts.environments` (every
environment and its helpers), `rollouts.local_model` (the embedded model), `rollouts.testing`
(the fake provider server), `rollouts.frozen` (read-only data), `rollouts.config` (model specs
and config files), `rollouts.errors` (every error).
"""

# --- the loop: running an agent ------------------------------------------------------------
from rollouts.agents import process_pending_tools, rollout, run_agent, run_agent_step

# --- types: what flows through the loop -----------------------------------------------------
from rollouts.dtypes import (
    Actor,
    AgentState,
    Completion,
    ContentBlock,
    Endpoint,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolCallContent,
    ToolResult,
    Trajectory,
    Usage,
)

# --- environments: the tools an agent works with (all of them: rollouts.environments) ------
from rollouts.environments import (
    BasicEnvironment,
    BrowsingEnvironment,
    CalculatorEnvironment,
    CodingEnvironment,
    Environment,
    EnvironmentBase,
    GitWorktreeEnvironment,
    ToolEnvironment,
    ToolError,
    check_environment,
    compose,
    tool,
)

# --- errors (all of them: rollouts.errors) --------------------------------------------------
from rollouts.errors import (
    AuthenticationError,
    ConfigurationError,
    ContextTooLongError,
    DirectoryInUseError,
    ProviderConnectionError,
    ProviderError,
    RateLimitError,
    RolloutsError,
    UnknownProviderError,
)

# --- evaluation and scoring -----------------------------------------------------------------
from rollouts.eval.io import load_csv, load_jsonl
from rollouts.eval.run import EvalConfig, EvalReport, evaluate, evaluate_sample, load_report
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.eval.scorers import (
    combine,
    exact_match,
    extract_last_number,
    extract_regex,
    extract_tag,
    llm_judge,
    metric,
    numeric_match,
)
from rollouts.eval.summary import group_samples, summarize, summarize_groups
from rollouts.eval.sync import evaluate_sync

# --- the loop: streaming (every event: rollouts.events) -------------------------------------
from rollouts.events import OnChunk, StreamEvent

# --- prompt optimization (the engine and its parts: rollouts.gepa) ---------------------------
from rollouts.gepa import GEPAConfig, GEPAResult, optimize, optimize_sync

# --- handlers: when a run stops and what it sees --------------------------------------------
from rollouts.handlers import (
    ToolConfirmResult,
    compose_handlers,
    confirm_tool_interactive,
    handle_stop_cost_budget,
    handle_stop_max_turns,
    handle_stop_on_empty_message,
    handle_stop_token_budget,
    handle_tool_error_stop,
    inject_tool_reminder,
    inject_turn_warning,
)

# --- models: adding a provider; scripted models for tests and demos -------------------------
from rollouts.providers import register_provider
from rollouts.providers.scripted import ScriptedModel, ScriptedReply, ScriptedToolCall, tool_call

# --- the loop: how a run behaves ------------------------------------------------------------
from rollouts.run_config import RunConfig

__version__ = "0.1.0"

__all__ = [
    # types
    "Actor",
    "AgentState",
    "Completion",
    "ContentBlock",
    "Endpoint",
    "ImageContent",
    "Message",
    "StopReason",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolCallContent",
    "ToolResult",
    "Trajectory",
    "Usage",
    # the loop
    "OnChunk",
    "RunConfig",
    "StreamEvent",
    "process_pending_tools",
    "rollout",
    "run_agent",
    "run_agent_step",
    # handlers
    "ToolConfirmResult",
    "compose_handlers",
    "confirm_tool_interactive",
    "handle_stop_cost_budget",
    "handle_stop_max_turns",
    "handle_stop_on_empty_message",
    "handle_stop_token_budget",
    "handle_tool_error_stop",
    "inject_tool_reminder",
    "inject_turn_warning",
    # environments
    "BasicEnvironment",
    "BrowsingEnvironment",
    "CalculatorEnvironment",
    "CodingEnvironment",
    "Environment",
    "EnvironmentBase",
    "GitWorktreeEnvironment",
    "ToolEnvironment",
    "ToolError",
    "check_environment",
    "compose",
    "tool",
    # models
    "ScriptedModel",
    "ScriptedReply",
    "ScriptedToolCall",
    "register_provider",
    "tool_call",
    # evaluation and scoring
    "EvalConfig",
    "EvalReport",
    "Metric",
    "Sample",
    "Score",
    "combine",
    "evaluate",
    "evaluate_sample",
    "evaluate_sync",
    "exact_match",
    "extract_last_number",
    "extract_regex",
    "extract_tag",
    "group_samples",
    "llm_judge",
    "load_csv",
    "load_jsonl",
    "load_report",
    "metric",
    "numeric_match",
    "summarize",
    "summarize_groups",
    # prompt optimization
    "GEPAConfig",
    "GEPAResult",
    "optimize",
    "optimize_sync",
    # errors
    "AuthenticationError",
    "ConfigurationError",
    "DirectoryInUseError",
    "ContextTooLongError",
    "ProviderConnectionError",
    "ProviderError",
    "RateLimitError",
    "RolloutsError",
    "UnknownProviderError",
]
