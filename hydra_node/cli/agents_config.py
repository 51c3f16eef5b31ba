"""What each coding agent needs to talk to a node (pure): its command line, its environment and
the configuration files the launcher writes (``hydra claude|opencode|pi|goose``, docs/agents.md).

Nothing here touches the user's own configuration: files go under the node home's
``agents/<tool>/`` folder (hydra's own, rewritten at each launch), and each tool is pointed at them
through the variable it documents:

* ``claude`` (Claude Code) speaks Anthropic's Messages API: ``ANTHROPIC_BASE_URL`` (no ``/v1``),
  ``ANTHROPIC_AUTH_TOKEN`` (sent as Bearer; ``ANTHROPIC_API_KEY`` would win, so it is removed),
  ``ANTHROPIC_MODEL`` and the per-tier defaults (opus, sonnet, haiku, the small fast model) all
  set to the chosen model; ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no telemetry, error
  reports or update checks: the mesh is the only thing it talks to);
* ``opencode``: ``OPENCODE_CONFIG`` names ``agents/opencode/opencode.json``, a ``hydra`` provider
  (``@ai-sdk/openai-compatible`` at ``<node>/v1``) whose model is the default (``hydra/<id>``),
  merged by opencode over the user's global config; ``OPENCODE_DISABLE_AUTOUPDATE=1``;
* ``pi``: ``PI_CODING_AGENT_DIR`` names ``agents/pi/``, holding ``models.json`` (a ``hydra``
  provider, ``api: "openai-completions"``) and ``settings.json`` (it is the default provider and
  model), so pi's own ``~/.pi/agent`` is left alone;
* ``goose``: the environment it reads before its ``config.yaml``: ``GOOSE_PROVIDER=openai``,
  ``GOOSE_MODEL``, ``OPENAI_HOST`` (the node's origin), ``OPENAI_BASE_PATH=v1/chat/completions``,
  ``OPENAI_API_KEY``.

The key is the node's (``$HYDRA_API_KEY``) or, when the node needs none, the placeholder
``hydra`` (every tool insists on one). ``tool_choice`` (``--tool-choice``) is sent as the
``x-hydra-tool-choice`` header through each tool's own custom-header setting
(``ANTHROPIC_CUSTOM_HEADERS``, the opencode provider's ``options.headers``, pi's provider
``headers``, goose's ``OPENAI_CUSTOM_HEADERS``): the node then forces (or forbids) tool calls
with its grammar, as ``tool_choice`` would (:mod:`hydra_node.api.tool_choice_header`).
``max_tokens`` (``--max-tokens``) bounds each answer through each tool's own setting
(``CLAUDE_CODE_MAX_OUTPUT_TOKENS``, opencode's model ``limit.output``, pi's ``maxTokens``,
``GOOSE_MAX_TOKENS``). ``reasoning`` (the model reasons: its ``/v1/models`` entry says so) tells
pi that the model thinks (its model entry's ``reasoning`` and ``compat.supportsReasoningEffort``:
pi then sends ``reasoning_effort`` and shows ``reasoning_content``, docs/reasoning.md); the other
tools find out from the answers themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AGENTS", "PLACEHOLDER_KEY", "TOOL_CHOICE_HEADER", "Agent", "LaunchPlan", "launch_plan"]

#: What the tools get as a key when the node requires none.
PLACEHOLDER_KEY = "hydra"
#: The header the node reads ``tool_choice`` from (hydra_node.api.tool_choice_header).
TOOL_CHOICE_HEADER = "x-hydra-tool-choice"
#: The context opencode is told a model has when an answer bound is given (it needs both); the
#: node refuses a prompt that does not fit its model's real context with a clear 400.
MAX_CONTEXT = 32768


@dataclass(frozen=True)
class Agent:
    command: str  # the executable looked up on PATH
    install: str  # the one-line hint when it is missing


AGENTS = {
    "claude": Agent("claude", "npm install -g @anthropic-ai/claude-code"),
    "opencode": Agent("opencode", "npm install -g opencode-ai"),
    "pi": Agent("pi", "npm install -g @mariozechner/pi-coding-agent"),
    "goose": Agent("goose", "see https://block.github.io/goose/docs/getting-started/installation (goose CLI)"),
}


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: ``argv`` with ``env`` set (and ``unset`` removed), after writing ``files``."""

    tool: str
    argv: tuple[str, ...]
    env: dict[str, str]
    unset: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # path -> content

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in base.items() if k not in self.unset}
        out.update(self.env)
        return out

    def to_json(self) -> dict:
        return {
            "tool": self.tool,
            "argv": list(self.argv),
            "env": dict(self.env),
            "unset": list(self.unset),
            "files": dict(self.files),
        }


def _json(obj: dict) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _claude(
    origin: str,
    model: str,
    key: str,
    args: tuple[str, ...],
    _dir: Path,
    choice: str,
    max_tokens: int | None,
    _reasoning: bool = False,
) -> LaunchPlan:
    headers = {"ANTHROPIC_CUSTOM_HEADERS": f"{TOOL_CHOICE_HEADER}: {choice}"} if choice else {}
    if max_tokens:
        headers["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_tokens)
    env = {
        **headers,
        "ANTHROPIC_BASE_URL": origin,
        "ANTHROPIC_AUTH_TOKEN": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return LaunchPlan("claude", ("claude", *args), env, unset=("ANTHROPIC_API_KEY",))


def _opencode(
    origin: str,
    model: str,
    key: str,
    args: tuple[str, ...],
    folder: Path,
    choice: str,
    max_tokens: int | None,
    _reasoning: bool = False,
) -> LaunchPlan:
    path = folder / "opencode.json"
    options: dict[str, Any] = {"baseURL": f"{origin}/v1", "apiKey": key}
    limit = {"limit": {"context": MAX_CONTEXT, "output": max_tokens}} if max_tokens else {}
    if choice:
        options["headers"] = {TOOL_CHOICE_HEADER: choice}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": f"hydra/{model}",
        "autoupdate": False,
        "provider": {
            "hydra": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Hydra mesh",
                "options": options,
                "models": {model: {"name": model, **limit}},
            }
        },
    }
    env = {"OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    return LaunchPlan("opencode", ("opencode", *args), env, files={str(path): _json(config)})


def _pi(
    origin: str,
    model: str,
    key: str,
    args: tuple[str, ...],
    folder: Path,
    choice: str,
    max_tokens: int | None,
    reasoning: bool = False,
) -> LaunchPlan:
    entry: dict[str, Any] = {"id": model, "name": model, "reasoning": reasoning, "input": ["text"]}
    if max_tokens:
        entry["maxTokens"] = max_tokens
    provider = {
        "baseUrl": f"{origin}/v1",
        "api": "openai-completions",
        "apiKey": key,
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": reasoning},
        "models": [entry],
    }
    if choice:
        provider["headers"] = {TOOL_CHOICE_HEADER: choice}
    models = {"providers": {"hydra": provider}}
    settings = {"defaultProvider": "hydra", "defaultModel": model}
    return LaunchPlan(
        "pi",
        ("pi", *args),
        {"PI_CODING_AGENT_DIR": str(folder)},
        files={str(folder / "models.json"): _json(models), str(folder / "settings.json"): _json(settings)},
    )


def _goose(
    origin: str,
    model: str,
    key: str,
    args: tuple[str, ...],
    _dir: Path,
    choice: str,
    max_tokens: int | None,
    _reasoning: bool = False,
) -> LaunchPlan:
    env = {
        "GOOSE_PROVIDER": "openai",
        "GOOSE_MODEL": model,
        "OPENAI_HOST": origin,
        "OPENAI_BASE_PATH": "v1/chat/completions",
        "OPENAI_API_KEY": key,
    }
    if choice:
        env["OPENAI_CUSTOM_HEADERS"] = f"{TOOL_CHOICE_HEADER}={choice}"
    if max_tokens:
        env["GOOSE_MAX_TOKENS"] = str(max_tokens)
    return LaunchPlan("goose", ("goose", *args), env)


_BUILDERS = {"claude": _claude, "opencode": _opencode, "pi": _pi, "goose": _goose}


def launch_plan(
    tool: str,
    origin: str,
    model: str,
    key: str | None,
    args: tuple[str, ...],
    agents_dir: Path,
    tool_choice: str = "",
    max_tokens: int | None = None,
    reasoning: bool = False,
) -> LaunchPlan:
    """The plan for ``tool`` against the node at ``origin`` (``http://host:port``, no ``/v1``),
    with its files under ``agents_dir/<tool>/``; ``tool_choice`` ("" = the tool's own);
    ``max_tokens``: the most tokens per answer (None = the tool's own); ``reasoning``: the model
    reasons (module doc)."""
    if tool not in _BUILDERS:
        raise ValueError(f"unknown agent {tool!r} (known: {', '.join(AGENTS)})")
    return _BUILDERS[tool](
        origin.rstrip("/"),
        model,
        key or PLACEHOLDER_KEY,
        tuple(args),
        agents_dir / tool,
        tool_choice,
        max_tokens,
        reasoning,
    )
