"""What every API dialect shares: the error type, chat events, ``n`` > 1, streamed answers, body checks, the port.

:mod:`.errors` (``ApiError``: one error type, rendered in each dialect's shape), :mod:`.chat` (one
chat generation through the router as typed chat events; usage sums), :mod:`.fanout` (several
generations at once), :mod:`.answer` (the one loop of a streamed answer; a dialect gives its
formatter), :mod:`.body` (a body as a JSON object; shared field checks),
:mod:`.tool_choice_header` (``x-hydra-tool-choice``), :mod:`.router_api` (the Protocol the
dialects need from the router), :mod:`.port` (``InferencePort``: ``/health``, the key, each path
to its dialect). The dialects are :mod:`hydra_node.openai`, :mod:`hydra_node.responses` and
:mod:`hydra_node.anthropic`; none imports another.
"""
