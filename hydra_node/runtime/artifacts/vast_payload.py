"""The VAST DataSpace trigger, its pure part: settings, the payload, and the retry rules (sans-IO).

After a publish commits, the node POSTs one JSON document (docs/placement.md, "VAST trigger") to
the configured endpoint so VAST's side can move or replicate the committed artifact between
namespaces and sites. This module decides everything about that request without doing it:
:func:`build_payload` (the document, with an ``idempotency_key`` derived from the operation id
and the manifest id, so a retried trigger is the same request), :func:`verdict` (deliver, retry,
or give up for an HTTP status or a connection failure) and :func:`retry_delay` (the node's one
back-off policy, ``hydra_node.backoff``, honouring a server's ``Retry-After``). The sender is
``vast.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from hydra_node.backoff import Backoff
from hydra_node.runtime.artifacts.manifest import Manifest

__all__ = [
    "EVENT_TYPE",
    "IDEMPOTENCY_HEADER",
    "MAX_OP_ID_CHARS",
    "PAYLOAD_VERSION",
    "VastSettings",
    "build_payload",
    "encode_payload",
    "idempotency_key",
    "retry_delay",
    "verdict",
]

#: ``type`` of the document, and its schema version (a receiver checks both).
EVENT_TYPE = "hydra.placement.committed"
PAYLOAD_VERSION = 1
#: The HTTP header that carries the idempotency key as well (the usual name for it).
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Longest operation id accepted (they are ``op-<hex>-<hex>``).
MAX_OP_ID_CHARS = 128
#: Longest a ``Retry-After`` may stretch one wait (a server asking for more is waited for this long).
MAX_RETRY_AFTER_S = 300.0
_KEY_CONTEXT = b"hydra/1/vast-trigger\x00"


@dataclass(frozen=True)
class VastSettings:
    """Where and how to send the trigger (``[placement] vast_*``, ``--vast-*``); validated when built."""

    endpoint: str
    tenant: str = ""
    dataspace: str = ""
    source_namespace: str = ""
    destination_namespace: str = ""
    target_site: str = ""
    max_attempts: int = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if (
            not isinstance(self.endpoint, str)
            or not self.endpoint.startswith(("http://", "https://"))
            or len(self.endpoint) <= len("https://")
            or any(c.isspace() for c in self.endpoint)
        ):
            raise ValueError(f"the VAST trigger endpoint must be an http:// or https:// URL, not {self.endpoint!r}")
        for name in ("tenant", "dataspace", "source_namespace", "destination_namespace", "target_site"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"VAST {name} must be text")
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= 100:
            raise ValueError(f"VAST trigger max_attempts must be 1 … 100, not {self.max_attempts!r}")
        if not 0 <= self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("VAST trigger back-off: 0 <= backoff_initial_s <= backoff_max_s")
        if not self.request_timeout_s > 0:
            raise ValueError("VAST trigger request_timeout_s must be > 0")

    @classmethod
    def from_placement(cls, section: Any) -> VastSettings | None:
        """The settings a ``[placement]`` section names (None without ``vast_trigger_endpoint``)."""
        if not section.vast_trigger_endpoint:
            return None
        return cls(
            section.vast_trigger_endpoint,
            section.vast_tenant,
            section.vast_dataspace,
            section.vast_source_namespace,
            section.vast_destination_namespace,
            section.vast_target_site,
        )

    def to_mapping(self) -> dict[str, Any]:
        """The JSON form an operation record keeps (so a retry sends where the first try did)."""
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> VastSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown VAST trigger settings: {', '.join(sorted(unknown))}")
        return cls(**dict(data))

    def target(self) -> dict[str, str]:
        """The target hints of the payload."""
        return {
            "tenant": self.tenant,
            "dataspace": self.dataspace,
            "source_namespace": self.source_namespace,
            "destination_namespace": self.destination_namespace,
            "target_site": self.target_site,
        }

    def backoff(self) -> Backoff:
        return Backoff(initial_s=self.backoff_initial_s, factor=2.0, max_s=self.backoff_max_s, jitter=0.25)


def idempotency_key(op_id: str, manifest_id: str) -> str:
    """The same for every try of one operation's trigger of one manifest; different otherwise."""
    if not isinstance(op_id, str) or not 0 < len(op_id) <= MAX_OP_ID_CHARS or "\x00" in op_id:
        raise ValueError(f"an operation id is 1 … {MAX_OP_ID_CHARS} characters without NUL")
    return hashlib.sha256(_KEY_CONTEXT + op_id.encode() + b"\x00" + manifest_id.encode()).hexdigest()


def build_payload(manifest: Manifest, *, op_id: str, settings: VastSettings) -> dict[str, Any]:
    """The document POSTed for the committed, signed ``manifest`` published by operation ``op_id``."""
    manifest.verify()
    doc = json.loads(manifest.to_json())
    return {
        "type": EVENT_TYPE,
        "version": PAYLOAD_VERSION,
        "idempotency_key": idempotency_key(op_id, manifest.manifest_id),
        "op_id": op_id,
        "kind": manifest.kind,
        "name": manifest.name,
        "checksum": {"algorithm": "sha256", "manifest_id": manifest.manifest_id},
        "byte_size": manifest.size,
        "file_count": len(manifest.files),
        "identity": doc["identity"],
        "location": manifest.location,
        "node_id": manifest.node_id,
        "created_at": manifest.created_at,
        "target": settings.target(),
        "manifest": doc,
    }


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """The request body: compact JSON with sorted keys (the same bytes on every try)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def verdict(status: int | None) -> str:
    """``"delivered"`` (2xx), ``"retry"`` (no answer: ``None``; 408, 425, 429, 5xx) or ``"refused"``
    (any other status: the receiver said no, and asking again would get the same answer)."""
    if status is None or status in (408, 425, 429) or 500 <= status <= 599:
        return "retry"
    if 200 <= status <= 299:
        return "delivered"
    return "refused"


def retry_delay(policy: Backoff, attempt: int, u: float, retry_after_s: float | None) -> float:
    """Wait before try ``attempt + 1`` (``attempt`` 0-based): jittered back-off, at least the server's
    ``Retry-After`` (capped at :data:`MAX_RETRY_AFTER_S`)."""
    delay = policy.delay(attempt, u)
    if retry_after_s is not None and retry_after_s > 0:
        delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
    return delay
