"""The bounded in-memory store behind ``previous_response_id`` (pure).

Each stored response keeps its conversation (the history it was given plus its own output, as
chat messages) and its response object (for ``GET /v1/responses/{id}``), both held as their
serialised JSON bytes: what the store counts is what it holds, so its bound is a bound on memory
(parsed JSON as Python objects can take twenty times its serialised size). The store holds at most
``max_responses`` responses and ``max_bytes`` bytes in all; beyond either, the least recently used
responses are evicted. A response larger than ``max_response_bytes`` is not stored (the caller
says so: docs/responses.md). Nothing survives a restart.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hydra_node.inference import ChatMessage

__all__ = [
    "MAX_RESPONSE_BYTES",
    "MAX_STORED_BYTES",
    "MAX_STORED_RESPONSES",
    "ResponsesStore",
    "StoredResponse",
    "serialised",
]

#: Defaults: 1000 responses, 64 MiB of serialised conversations and response objects in all,
#: 8 MiB for any one response.
MAX_STORED_RESPONSES = 1000
MAX_STORED_BYTES = 64 * 1024 * 1024
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def serialised(conversation: Sequence[ChatMessage], body: dict) -> tuple[bytes, bytes]:
    """The stored form of a response: its conversation's and its response object's JSON bytes."""
    return _json([m.to_wire() for m in conversation]), _json(body)


@dataclass(frozen=True)
class StoredResponse:
    conversation_json: bytes
    body_json: bytes  # exactly what ``GET /v1/responses/{id}`` answers

    @property
    def size(self) -> int:
        return len(self.conversation_json) + len(self.body_json)

    @property
    def conversation(self) -> tuple[ChatMessage, ...]:
        return tuple(ChatMessage.from_wire(m) for m in json.loads(self.conversation_json))

    @property
    def body(self) -> dict:
        return json.loads(self.body_json)


class ResponsesStore:
    def __init__(
        self,
        max_responses: int = MAX_STORED_RESPONSES,
        max_bytes: int = MAX_STORED_BYTES,
        max_response_bytes: int | None = None,
    ):
        """``max_response_bytes`` defaults to :data:`MAX_RESPONSE_BYTES` (at most ``max_bytes``)."""
        one = min(MAX_RESPONSE_BYTES, max_bytes) if max_response_bytes is None else max_response_bytes
        if max_responses < 1 or max_bytes < 1 or not 1 <= one <= max_bytes:
            raise ValueError(
                "the responses store needs room for at least one response "
                "(max_responses >= 1, 1 <= max_response_bytes <= max_bytes)"
            )
        self.max_responses, self.max_bytes, self.max_response_bytes = max_responses, max_bytes, one
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0  # serialised bytes held: always <= max_bytes
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def size_of(self, conversation: Sequence[ChatMessage], body: dict) -> int:
        """The bytes a response would take in the store."""
        return sum(map(len, serialised(conversation, body)))

    def put(self, resp_id: str, conversation: Sequence[ChatMessage], body: dict | None = None) -> bool:
        """Store a response under ``resp_id``; False (nothing stored) when it alone is larger than
        ``max_response_bytes``."""
        item = StoredResponse(*serialised(conversation, body if body is not None else {"id": resp_id}))
        if item.size > self.max_response_bytes:
            return False
        self.pop(resp_id)
        self._items[resp_id] = item
        self.bytes += item.size
        while len(self._items) > self.max_responses or self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.size
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
            self.bytes -= found.size
        return found is not None
