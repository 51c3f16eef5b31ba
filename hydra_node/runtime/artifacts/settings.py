"""``[placement]`` checks and the namespaces it names (docs/placement.md, docs/config.md).

The config loader (``hydra_node/config.py``) keeps the ``PlacementSection`` dataclass and calls
:func:`check_placement` from its ``validate``, with its own error type, so a bad key is one
``configuration error`` line naming it.  :class:`Namespace` is where an operation publishes to or
fetches from: a POSIX root or an S3 bucket (endpoint, region and prefix from the file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_CACHE_TTL_SECS", "S3_PART_MIB", "VAST_KEYS", "Namespace", "check_placement", "namespaces_of"]

#: Longest cache TTL accepted (a year); 0 means no TTL.
MAX_CACHE_TTL_SECS = 365 * 86400
#: Bounds of ``s3_multipart_threshold_mb`` and ``s3_part_size_mb`` in MiB: S3 takes parts of 5 MiB
#: (but the last) up to 5 GiB, and one PUT of at most 5 GiB.
S3_PART_MIB = (5, 5120)
#: The ``[placement]`` keys that only mean something with ``vast_trigger_endpoint``.
VAST_KEYS = ("vast_tenant", "vast_dataspace", "vast_source_namespace", "vast_destination_namespace", "vast_target_site")


@dataclass(frozen=True)
class Namespace:
    """A shared namespace: ``kind`` ``"posix"`` (``root``) or ``"s3"`` (``bucket``, ``endpoint``,
    ``region``, ``prefix``)."""

    kind: str
    root: str = ""
    bucket: str = ""
    endpoint: str = ""
    region: str = ""
    prefix: str = ""

    @property
    def location(self) -> str:
        if self.kind == "posix":
            return f"posix:{self.root}"
        return f"s3://{self.bucket}/{self.prefix.strip('/')}".rstrip("/")

    def to_json(self) -> dict:
        out: dict[str, Any] = {"type": self.kind, "location": self.location}
        if self.kind == "posix":
            out["root"] = self.root
        else:
            out.update(
                bucket=self.bucket, endpoint=self.endpoint or None, region=self.region or None, prefix=self.prefix
            )
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Namespace:
        """The namespace :meth:`to_json` described (an operation file's ``namespace``)."""
        return cls(
            str(doc.get("type", "posix")),
            root=str(doc.get("root") or ""),
            bucket=str(doc.get("bucket") or ""),
            endpoint=str(doc.get("endpoint") or ""),
            region=str(doc.get("region") or ""),
            prefix=str(doc.get("prefix") or ""),
        )


def _http_url(value: str) -> bool:
    return value.startswith(("http://", "https://")) and len(value) > len("https://") and " " not in value


def check_placement(s: Any, prefix: str, error: Callable[[str], Exception]) -> None:
    """Raise ``error(message)`` for a ``[placement]`` value that cannot take effect as written."""

    def bad(key: str, msg: str) -> None:
        raise error(f"[{prefix}].{key}: {msg}")

    if s.posix_root and not s.posix_root.startswith("/"):
        bad("posix_root", f"must be an absolute path, not {s.posix_root!r}")
    if s.s3_endpoint and not _http_url(s.s3_endpoint):
        bad("s3_endpoint", f"must be an http:// or https:// URL, not {s.s3_endpoint!r}")
    for key in ("s3_endpoint", "s3_region", "s3_prefix"):
        if getattr(s, key) and not s.s3_bucket:
            bad(key, "has no effect without s3_bucket")
    if s.s3_prefix.startswith("/") or ".." in s.s3_prefix.split("/"):
        bad("s3_prefix", f"must be a relative key prefix without '..', not {s.s3_prefix!r}")
    for key in ("s3_multipart_threshold_mb", "s3_part_size_mb"):
        if not S3_PART_MIB[0] <= getattr(s, key) <= S3_PART_MIB[1]:
            bad(key, f"must be {S3_PART_MIB[0]} .. {S3_PART_MIB[1]} MiB (S3's part sizes), not {getattr(s, key)!r}")
    if not 0 <= s.cache_ttl_secs <= MAX_CACHE_TTL_SECS:
        bad("cache_ttl_secs", f"must be 0 (no TTL) .. {MAX_CACHE_TTL_SECS}, not {s.cache_ttl_secs!r}")
    if not s.cache_capacity_gb >= 0:
        bad("cache_capacity_gb", f"must be >= 0 (0: no limit), not {s.cache_capacity_gb!r}")
    if s.prefetch_threshold != 0:
        bad(
            "prefetch_threshold",
            "is not supported: artifacts are materialised when needed "
            "(serve --model placement:NAME, POST /api/placement/fetch); leave it at 0",
        )
    if s.vast_trigger_endpoint and not _http_url(s.vast_trigger_endpoint):
        bad("vast_trigger_endpoint", f"must be an http:// or https:// URL, not {s.vast_trigger_endpoint!r}")
    for key in VAST_KEYS:
        if getattr(s, key) and not s.vast_trigger_endpoint:
            bad(key, "has no effect without vast_trigger_endpoint")


def namespaces_of(s: Any) -> list[Namespace]:
    """The namespaces ``[placement]`` configures, in the order a fetch looks in them (POSIX first)."""
    out = []
    if s.posix_root:
        out.append(Namespace("posix", root=s.posix_root))
    if s.s3_bucket:
        out.append(Namespace("s3", bucket=s.s3_bucket, endpoint=s.s3_endpoint, region=s.s3_region, prefix=s.s3_prefix))
    return out
