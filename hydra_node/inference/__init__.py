"""The contract between the API, the router, local runners and remote peers.

A generation is described by a :class:`GenerationRequest` and produces a stream of
events: zero or more :class:`TextDelta` then exactly one :class:`Finished`, or a
:class:`GenerationError` raised part-way.  Everything here is plain data with a
``to_wire()``/``from_wire()`` pair made of CBOR-friendly types (dict, list, str,
int, float, bool, None), so the same objects cross the runner channel and the
peer links unchanged.

Bytes from a peer or a child are decoded strictly (:mod:`hydra_node.codec`) and turned
into typed events here: :func:`event_from_wire` returns a :class:`TextDelta` or a
:class:`Finished`, or raises a :class:`RemoteError` — never another exception. A remote
failure is never relayed as success: it becomes 502 (the peer failed, or broke the
protocol: :class:`MalformedRemoteEvent`) or 503 (the peer is busy or unavailable), with
the peer's message and code.
"""

from hydra_node.inference.capabilities import *  # noqa: F401,F403
from hydra_node.inference.capabilities import __all__ as _capabilities_all
from hydra_node.inference.embeddings import *  # noqa: F401,F403
from hydra_node.inference.embeddings import __all__ as _embeddings_all
from hydra_node.inference.errors import *  # noqa: F401,F403
from hydra_node.inference.images import *  # noqa: F401,F403
from hydra_node.inference.images import __all__ as _images_all
from hydra_node.inference.errors import __all__ as _errors_all
from hydra_node.inference.events import *  # noqa: F401,F403
from hydra_node.inference.events import __all__ as _events_all
from hydra_node.inference.request import *  # noqa: F401,F403
from hydra_node.inference.request import __all__ as _request_all
from hydra_node.inference.tokenize import *  # noqa: F401,F403
from hydra_node.inference.tokenize import __all__ as _tokenize_all

__all__ = [
    *_errors_all,
    *_request_all,
    *_events_all,
    *_embeddings_all,
    *_capabilities_all,
    *_tokenize_all,
    *_images_all,
]
