"""OpenAI's API dialect on :9337: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

:mod:`.routes` (``OpenAIApi``), :mod:`.parse` + :mod:`.chat_parse` (body -> requests, pure),
:mod:`.format` (response shapes and stream chunks, pure), :mod:`.embeddings` (``EmbeddingsApi``),
:mod:`.moa_chat` (``model: "mesh"`` answered in OpenAI's shapes). docs/api.md.
"""

from hydra_node.openai.embeddings import EmbeddingsApi
from hydra_node.openai.routes import OpenAIApi

__all__ = ["EmbeddingsApi", "OpenAIApi"]
