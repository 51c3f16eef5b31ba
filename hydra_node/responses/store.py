"""The bounded in-memory store behind ``previous_response_id`` (pure).

Each stored response keeps its conversation (the history it was given plus its own output, as
chat messages) and its response object (for ``GET /v1/responses/{id}``). The store holds at most
``max_responses`` responses and ``max_chars`` characters (conversation text and response JSON);
beyond either, the least recently used responses are evicted. A response that alone exceeds
``max_chars`` is not stored. Nothing survives a restart.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hydra_node.inference import ChatMessage

__all__ = ["MAX_STORED_CHARS", "MAX_STORED_RESPONSES", "ResponsesStore", "StoredResponse"]

#: Defaults: 1000 responses, 64 Mi characters of conversation in all.
MAX_STORED_RESPONSES = 1000
MAX_STORED_CHARS = 64 * 1024 * 1024


def _chars(messages: Sequence[ChatMessage]) -> int:
    return sum(
        len(m.content)
        + len(m.tool_call_id)
        + len(m.name)
        + 16
        + sum(len(c.id) + len(c.name) + len(c.arguments) for c in m.tool_calls)
        for m in messages
    )


@dataclass(frozen=True)
class StoredResponse:
    conversation: tuple[ChatMessage, ...]
    body: dict
    size: int


class ResponsesStore:
    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_chars: int = MAX_STORED_CHARS):
        if max_responses < 1 or max_chars < 1:
            raise ValueError("the responses store needs room for at least one response")
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.chars = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, resp_id: str, conversation: Sequence[ChatMessage], body: dict | None = None) -> bool:
        """Store a response under ``resp_id``; False when it alone is larger than the store."""
        body = body if body is not None else {"id": resp_id}
        size = _chars(conversation) + len(json.dumps(body, separators=(",", ":")))
        if size > self.max_chars:
            return False
        self.pop(resp_id)
        self._items[resp_id] = StoredResponse(tuple(conversation), body, size)
        self.chars += size
        while len(self._items) > self.max_responses or self.chars > self.max_chars:
            _, old = self._items.popitem(last=False)
            self.chars -= old.size
            self.evicted += 1
        return True

    def lookup(self, resp_id: str) -> StoredResponse | None:
        found = self._items.get(resp_id)
        if found is not None:
            self._items.move_to_end(resp_id)
        return found

    def get(self, resp_id: str) -> tuple[ChatMessage, ...] | None:
        """The conversation a ``previous_response_id`` continues, or None."""
        found = self.lookup(resp_id)
        return None if found is None else found.conversation

    def pop(self, resp_id: str) -> bool:
        found = self._items.pop(resp_id, None)
        if found is not None:
            self.chars -= found.size
        return found is not None
