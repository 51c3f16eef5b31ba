"""Anthropic's Messages API dialect: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

:mod:`.routes` (``MessagesApi``), :mod:`.request` (body -> call, pure), :mod:`.format` (message
objects, errors and typed stream events, pure), :mod:`.models` (which mesh model answers a
``claude-*`` id). docs/agents.md.
"""

from hydra_node.anthropic.routes import MessagesApi

__all__ = ["MessagesApi"]
