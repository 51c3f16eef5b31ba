"""``[rehost]``: keeping models hosted when their hosts leave (docs/models.md "Growing back").

``enabled`` (default true): this node offers its spare room to re-host a model the mesh lost
(false: it never re-hosts, and still announces what it wants kept hosted); ``min_hosts``: a table
model id → the hosts that model should have (0: never re-host it); ``keep_recent_s`` (default
600; 0: off): a model requested through this node's API within this long is kept at one host;
``settle_s`` (default 3): how long a model must have been short of hosts before this node acts;
``max_models`` (default 2): how many models this node re-hosts at most.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra_node.config.defaults import ConfigError, _check
from hydra_node.runtime.hosting.rehost_wire import MAX_KEEP_HOSTED, MAX_MIN_HOSTS, min_hosts_problem

__all__ = ["MAX_REHOST_MIN_HOSTS", "RehostSection", "parse_rehost_section"]

#: The most hosts ``[rehost].min_hosts`` may ask for one model.
MAX_REHOST_MIN_HOSTS = MAX_MIN_HOSTS
#: The most entries of ``[rehost].min_hosts`` (what one announcement's ``keep_hosted`` carries).
MAX_MIN_HOSTS_ENTRIES = MAX_KEEP_HOSTED


@dataclass(frozen=True)
class RehostSection:
    enabled: bool = True
    #: model id → hosts wanted (0: never re-host it)
    min_hosts: Mapping[str, int] = field(default_factory=dict)
    keep_recent_s: float = 600.0
    settle_s: float = 3.0
    max_models: int = 2


def check_min_hosts_entry(key: str, model: Any, n: Any) -> None:
    """One ``min_hosts`` entry: a model id and an integer 0 … MAX_REHOST_MIN_HOSTS (ConfigError naming ``key``)."""
    problem = min_hosts_problem(model, n)
    if problem is not None:
        raise ConfigError(f"{key if problem[0] == 'model' else f'{key}.{model}'}: {problem[1]}")


def parse_rehost_section(data: Any) -> RehostSection:
    """``[rehost]`` → :class:`RehostSection`; unknown keys and bad values name the key."""
    if not isinstance(data, Mapping):
        raise ConfigError("[rehost]: must be a table")
    known = {"enabled", "min_hosts", "keep_recent_s", "settle_s", "max_models"}
    for key in data:
        _check(key in known, f"[rehost].{key}", f"unknown key (known: {', '.join(sorted(known))})")
    enabled = data.get("enabled", True)
    _check(isinstance(enabled, bool), "[rehost].enabled", f"must be true or false, not {enabled!r}")
    table = data.get("min_hosts", {})
    _check(isinstance(table, Mapping), "[rehost].min_hosts", 'must be a table of model = hosts, e.g. {"m" = 1}')
    _check(
        len(table) <= MAX_MIN_HOSTS_ENTRIES,
        "[rehost].min_hosts",
        f"at most {MAX_MIN_HOSTS_ENTRIES} models, not {len(table)}",
    )
    for model, n in table.items():
        check_min_hosts_entry("[rehost].min_hosts", model, n)
    out: dict[str, Any] = {}
    for key, lo, hi in (("keep_recent_s", 0.0, 30 * 86400.0), ("settle_s", 0.0, 600.0)):
        v = data.get(key, getattr(RehostSection, key))
        _check(
            isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi,
            f"[rehost].{key}",
            f"must be a number of seconds between {lo:g} and {hi:g}, not {v!r}",
        )
        out[key] = float(v)
    max_models = data.get("max_models", RehostSection.max_models)
    _check(
        isinstance(max_models, int) and not isinstance(max_models, bool) and 0 <= max_models <= 8,
        "[rehost].max_models",
        f"must be an integer between 0 and 8, not {max_models!r}",
    )
    return RehostSection(enabled=enabled, min_hosts=dict(table), max_models=max_models, **out)
