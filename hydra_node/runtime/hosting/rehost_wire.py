"""The re-host keys of a mesh announcement's ``extra`` (protocol/README.md "Re-hosting"), parsed
defensively: a peer's malformed value is dropped and counted, never raised.

* ``spare``: ``{"free_bytes": int, "models": int}``: the weights this node would still load (its
  usable memory less what its hosted models take) and how many more models it would re-host.
  Absent: the node offers nothing (re-hosting off, a client, an older node).
* ``standby``: ``true`` on a node started with ``serve --standby``.
* ``keep_hosted``: ``[[model, min_hosts, ident or "", sha256 or "", size_bytes], ...]``: the
  models this node wants kept hosted (its ``[rehost].min_hosts`` and the recent-use policy).
* ``model_files``: ``[[model, sha256, size_bytes], ...]``: the files of the models it hosts.
* ``rehosting``: ``[model, ...]``: the models it took over (or is taking over) for the mesh.
* ``rehost_failed``: ``[[model, retry_after_unix_s], ...]``: its last re-host of these failed;
  it is not a candidate for them before then.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra_node.mesh.membership.announcement import IDENT_HEX

__all__ = [
    "FAILED_KEY",
    "FILES_KEY",
    "KEEP_KEY",
    "MAX_KEEP_HOSTED",
    "MAX_REHOST_LIST",
    "REHOSTING_KEY",
    "REHOST_EXTRA_ITEMS",
    "SPARE_KEY",
    "STANDBY_KEY",
    "MAX_MIN_HOSTS",
    "ModelFile",
    "PeerRehost",
    "Spare",
    "Wanted",
    "parse_rehost_extra",
    "rehost_extra",
]

SPARE_KEY = "spare"
STANDBY_KEY = "standby"
KEEP_KEY = "keep_hosted"
FILES_KEY = "model_files"
REHOSTING_KEY = "rehosting"
FAILED_KEY = "rehost_failed"
#: Most ``keep_hosted`` entries one announcement carries (6 ``extra`` items each).
MAX_KEEP_HOSTED = 16
#: Most entries of ``model_files``, ``rehosting`` and ``rehost_failed`` (each).
MAX_REHOST_LIST = 8
#: The largest ``min_hosts`` a peer may ask for (a bigger value is read as this).
MAX_MIN_HOSTS = 16
#: ``extra`` items (mesh/membership/announcement.py counts 256 in all) our re-host keys take at
#: most: ``keep_hosted`` is cut (its oldest entries first) to stay within it.
REHOST_EXTRA_ITEMS = 64
_HEX64 = re.compile(r"[0-9a-f]{64}")
_IDENT = re.compile(r"[0-9a-f]{%d}" % IDENT_HEX)  # a model entry's ident (announcement.py)
_MAX_ID = 256


@dataclass(frozen=True)
class Spare:
    free_bytes: int
    models: int


@dataclass(frozen=True)
class Wanted:
    """A model someone wants kept hosted, and what is known of its file ("" / 0: unknown)."""

    model: str
    min_hosts: int
    ident: str = ""
    sha256: str = ""
    size_bytes: int = 0

    def filled(self, other: Wanted) -> Wanted:
        """This wish with ``other``'s file facts where this one knows nothing."""
        return Wanted(
            self.model,
            self.min_hosts,
            self.ident or other.ident,
            self.sha256 or other.sha256,
            self.size_bytes or other.size_bytes,
        )


@dataclass(frozen=True)
class ModelFile:
    model: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class PeerRehost:
    """What one announcement says about re-hosting (the malformed parts dropped, counted in ``malformed``)."""

    spare: Spare | None = None
    standby: bool = False
    keep: tuple[Wanted, ...] = ()
    files: tuple[ModelFile, ...] = ()
    claims: frozenset[str] = frozenset()
    failed: Mapping[str, float] = field(default_factory=dict)
    malformed: int = 0


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _model_id(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= _MAX_ID


def min_hosts_problem(model: Any, n: Any) -> tuple[str, str] | None:
    """Why ``model = n`` is no valid ``min_hosts`` entry (the config key, the management API):
    ``("model" | "min_hosts", reason)``; None when it is valid."""
    if not (isinstance(model, str) and model and model == model.strip() and _model_id(model)):
        return "model", f"model ids must be 1 … {_MAX_ID} characters without surrounding spaces, not {model!r:.80}"
    if not (_uint(n) and n <= MAX_MIN_HOSTS):
        return "min_hosts", f"must be an integer between 0 and {MAX_MIN_HOSTS} (0: never re-host it), not {n!r:.40}"
    return None


def parse_rehost_extra(extra: Mapping[str, Any]) -> PeerRehost:
    """The re-host keys of a peer's ``extra``; each malformed key or entry is skipped and counted."""
    bad = 0
    spare = None
    raw = extra.get(SPARE_KEY)
    if raw is not None:
        if isinstance(raw, Mapping) and _uint(raw.get("free_bytes")) and _uint(raw.get("models")):
            spare = Spare(raw["free_bytes"], raw["models"])
        else:
            bad += 1
    raw = extra.get(STANDBY_KEY)
    standby = raw is True
    bad += raw is not None and not isinstance(raw, bool)

    def entries(key: str, limit: int) -> list[Any]:
        nonlocal bad
        value = extra.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            bad += 1
            return []
        return value[:limit]

    keep: list[Wanted] = []
    for item in entries(KEEP_KEY, MAX_KEEP_HOSTED):
        if (
            isinstance(item, list)
            and len(item) == 5
            and _model_id(item[0])
            and _uint(item[1])
            and isinstance(item[2], str)
            and (item[2] == "" or _IDENT.fullmatch(item[2]))
            and isinstance(item[3], str)
            and (item[3] == "" or _HEX64.fullmatch(item[3]))
            and _uint(item[4])
        ):
            keep.append(Wanted(item[0], min(item[1], MAX_MIN_HOSTS), item[2], item[3], item[4]))
        else:
            bad += 1
    files: list[ModelFile] = []
    for item in entries(FILES_KEY, MAX_REHOST_LIST):
        if (
            isinstance(item, list)
            and len(item) == 3
            and _model_id(item[0])
            and isinstance(item[1], str)
            and _HEX64.fullmatch(item[1])
            and _uint(item[2])
        ):
            files.append(ModelFile(item[0], item[1], item[2]))
        else:
            bad += 1
    claims: set[str] = set()
    for item in entries(REHOSTING_KEY, MAX_REHOST_LIST):
        if _model_id(item):
            claims.add(item)
        else:
            bad += 1
    failed: dict[str, float] = {}
    for item in entries(FAILED_KEY, MAX_REHOST_LIST):
        if isinstance(item, list) and len(item) == 2 and _model_id(item[0]) and _uint(item[1]):
            failed[item[0]] = float(item[1])
        else:
            bad += 1
    return PeerRehost(spare, standby, tuple(keep), tuple(files), frozenset(claims), failed, bad)


def rehost_extra(
    *,
    spare: Spare | None,
    standby: bool,
    keep: Sequence[Wanted],
    files: Sequence[ModelFile],
    claims: Sequence[str],
    failed: Mapping[str, float],
) -> dict[str, Any]:
    """Our ``extra`` entries (empty lists left out, so a node that re-hosts nothing adds little)."""
    out: dict[str, Any] = {}
    if spare is not None:
        out[SPARE_KEY] = {"free_bytes": spare.free_bytes, "models": spare.models}
    if standby:
        out[STANDBY_KEY] = True
    if files:
        out[FILES_KEY] = [[f.model, f.sha256, f.size_bytes] for f in files[:MAX_REHOST_LIST]]
    if claims:
        out[REHOSTING_KEY] = list(claims)[:MAX_REHOST_LIST]
    if failed:
        out[FAILED_KEY] = [[m, int(t)] for m, t in sorted(failed.items())[:MAX_REHOST_LIST]]
    room = REHOST_EXTRA_ITEMS - sum(_items(v) for v in out.values()) - 1
    if keep and room >= 6:  # the list, then 6 items an entry (the entry and its 5 values)
        out[KEEP_KEY] = [
            [w.model, w.min_hosts, w.ident, w.sha256, w.size_bytes] for w in keep[: min(MAX_KEEP_HOSTED, room // 6)]
        ]
    return out


def _items(value: Any) -> int:
    """Items ``value`` costs in ``extra`` (as the announcement counts them; keys are free)."""
    if isinstance(value, Mapping):
        return 1 + sum(_items(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_items(v) for v in value)
    return 1
