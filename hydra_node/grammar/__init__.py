"""Pure grammar vocabulary: JSON Schema -> GBNF, and the model's ``<tool_call>`` text back into calls.

:mod:`.constraints` (the GBNF a request gets for ``response_format`` and tool calls),
:mod:`.schema` + :mod:`.schema_types` (JSON Schema -> GBNF), :mod:`.terms` (JSON building blocks),
:mod:`.regex` (a schema ``pattern`` as GBNF), :mod:`.toolcalls` + :mod:`.toolcall_stream` (the
streaming tool-call parsers). No IO; used by every API dialect.
"""
