"""Session and prefix affinity: keys derived from a request, and a bounded TTL table of targets."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

from hydra_node.routing.scheduler_config import SchedulerConfig
from hydra_node.routing._score import RequestFeatures
from hydra_node.routing.telemetry import Target

#: Affinity entries kept (LRU); upstream keeps 4096.
MAX_AFFINITY_ENTRIES = 4096
#: Characters of a session id considered (longer ids are truncated before hashing).
MAX_SESSION_CHARS = 256
#: Rough characters per token, to size the prefix a key covers without a tokenizer.
CHARS_PER_TOKEN = 4


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:24]


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def affinity_keys(
    body: object, model: str, config: SchedulerConfig, session_header: str | None = None
) -> tuple[str | None, str | None, int]:
    """``(session_key, prefix_key, prefix_tokens)`` of an OpenAI request body.

    Session key: ``session_header`` (e.g. ``x-session-id``), else body ``prompt_cache_key``,
    ``user`` or ``session_id``. Prefix key: the first ``config.prefix_affinity_chars`` characters of
    the tools, the system/developer messages and the first user message (or ``prompt``). Both are
    hashed with the model id. Malformed bodies just yield no keys.
    """
    if not isinstance(body, dict):
        return None, None, 0
    session = session_header
    for name in ("prompt_cache_key", "user", "session_id"):
        if session:
            break
        value = body.get(name)
        session = value if isinstance(value, str) else None
    session_key = _digest("s", model, session[:MAX_SESSION_CHARS]) if session else None

    parts: list[str] = []
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        try:
            parts.append(json.dumps(tools, sort_keys=True)[: config.prefix_affinity_chars])
        except (TypeError, ValueError):
            pass
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if role in ("system", "developer"):
                parts.append(_text(message.get("content")))
            elif role == "user":
                parts.append(_text(message.get("content")))
                break
    elif isinstance(body.get("prompt"), str):
        parts.append(body["prompt"])
    prefix = "\n".join(parts)[: config.prefix_affinity_chars]
    if not prefix:
        return session_key, None, 0
    return session_key, _digest("p", model, prefix), len(prefix) // CHARS_PER_TOKEN


def request_features(
    body: object, model: str, prompt_tokens: int, config: SchedulerConfig, session_header: str | None = None
) -> RequestFeatures:
    """Features of an OpenAI chat/completions body whose prompt has ``prompt_tokens`` tokens."""
    session_key, prefix_key, prefix_tokens = affinity_keys(body, model, config, session_header)
    max_tokens = None
    if isinstance(body, dict):
        for name in ("max_completion_tokens", "max_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                max_tokens = value
                break
    return RequestFeatures(
        model=model,
        prompt_tokens=max(0, prompt_tokens),
        max_tokens=max_tokens,
        session_key=session_key,
        prefix_key=prefix_key,
        prefix_tokens=min(prefix_tokens, max(0, prompt_tokens)),
    )


@dataclass(frozen=True)
class AffinityEntry:
    target: Target
    tokens: int  # prompt tokens the target is assumed to hold in cache for this key
    expires_at: float


class AffinityTable:
    """Key -> last target, with a TTL refreshed on use and at most ``max_entries`` (LRU)."""

    def __init__(self, max_entries: int = MAX_AFFINITY_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, AffinityEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str | None, now: float) -> AffinityEntry | None:
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now > entry.expires_at:
            del self._entries[key]
            return None
        return entry

    def put(self, key: str | None, target: Target, tokens: int, now: float, ttl_s: float) -> None:
        if key is None:
            return
        self._entries.pop(key, None)
        while len(self._entries) >= self.max_entries:
            self._entries.popitem(last=False)
        self._entries[key] = AffinityEntry(target, tokens, now + ttl_s)

    def forget_target(self, target: Target) -> int:
        """Drop every entry pointing at ``target`` (it left the mesh); returns how many."""
        keys = [k for k, e in self._entries.items() if e.target == target]
        for key in keys:
            del self._entries[key]
        return len(keys)
