"""OpenAI's Responses API dialect: ``POST /v1/responses`` (the subset the OpenAI Agents SDK uses).

:mod:`.routes` (``ResponsesApi``), :mod:`.request` + :mod:`.items` (body -> call, pure),
:mod:`.constraints` (call -> chat request), :mod:`.output` and :mod:`.stream` (outcomes -> output
items and typed server-sent events, pure), :mod:`.store` (``previous_response_id``). docs/responses.md.
"""

from hydra_node.responses.routes import ResponsesApi

__all__ = ["ResponsesApi"]
