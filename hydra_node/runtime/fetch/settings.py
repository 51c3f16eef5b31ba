"""``[models]`` in the config file: the model cache and where models come from (docs/models.md).

The config loader (``hydra_node/config.py``) calls :func:`parse_models_section` with its own error
type, so a bad key or value is one ``configuration error`` line naming the key."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["MAX_READ_TIMEOUT_S", "ModelsSection", "models_settings", "one_capacity", "parse_models_section"]

log = logging.getLogger("hydra.config")

#: Upper bound on ``read_timeout_s`` (an hour without a byte is a dead server).
MAX_READ_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ModelsSection:
    #: Deprecated: the models are in the node's one cache, whose capacity is ``[placement]
    #: cache_capacity_gb``; this key still sets it (:func:`one_capacity`, a warning in the log).
    cache_limit_gb: float = 0.0
    #: Ask mesh peers that hold a model for it before going to the internet.
    peer_fetch: bool = True
    #: Seconds without a byte from a server before a download fails with ``timeout`` (resumable).
    read_timeout_s: float = 30.0
    #: Slowest accepted download (bytes per second, averaged over each ``read_timeout_s`` window): a
    #: server trickling bytes slower than this fails with ``timeout`` (resumable). 0: no floor.
    min_rate_bytes_s: float = 1024.0
    #: Send our cached, verified models to mesh peers that ask (``artifact_fetch`` streams, and the
    #: retired ``model_fetch`` for peers of the previous protocol generation).
    share: bool = True
    #: Offer them through ``artifact_fetch`` too (announced in ``artifacts_held``). false: only over
    #: the retired ``model_fetch`` stream, as a node of the previous protocol generation does.
    offer_artifacts: bool = True


def parse_models_section(data: Any, error: Callable[[str], Exception]) -> ModelsSection:
    """``[models]`` → :class:`ModelsSection`; ``error(message)`` is raised for an unknown key or a bad value."""
    if not isinstance(data, Mapping):
        raise error("[models]: must be a table")
    known = {f.name for f in fields(ModelsSection)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"[models].{key}"
        if key not in known:
            raise error(f"{full}: unknown key (known: {', '.join(sorted(known))})")
        if key in ("peer_fetch", "share", "offer_artifacts"):
            if not isinstance(value, bool):
                raise error(f"{full}: must be true or false, not {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(f"{full}: must be a number, not {value!r}")
        kwargs[key] = value if isinstance(value, bool) else float(value)
    s = ModelsSection(**kwargs)
    if not s.cache_limit_gb >= 0:
        raise error(f"[models].cache_limit_gb: must be >= 0 (0: no limit), not {s.cache_limit_gb!r}")
    if not 0 < s.read_timeout_s <= MAX_READ_TIMEOUT_S:
        raise error(
            f"[models].read_timeout_s: must be > 0 and at most {MAX_READ_TIMEOUT_S:g}, not {s.read_timeout_s!r}"
        )
    if not 0 <= s.min_rate_bytes_s < float("inf"):
        raise error(f"[models].min_rate_bytes_s: must be >= 0 (0: no floor), not {s.min_rate_bytes_s!r}")
    return s


def one_capacity(data: Mapping[str, Any], error: Callable[[str], Exception]) -> float | None:
    """The one cache's capacity in GB that the deprecated ``[models] cache_limit_gb`` of ``data``
    (the file's parsed TOML, already checked) sets for ``[placement] cache_capacity_gb``, with a
    warning naming the replacement; None when it is absent or ``cache_capacity_gb`` says the same.
    Both, with different values, raise ``error``."""
    models, section = data.get("models"), data.get("placement")
    if not isinstance(models, Mapping) or "cache_limit_gb" not in models:
        return None
    old = float(models["cache_limit_gb"])
    log.warning(
        "event=config_deprecated key=[models].cache_limit_gb replacement=[placement].cache_capacity_gb message=%r",
        "models and placement's artifacts share one cache now; set [placement] cache_capacity_gb instead",
    )
    if isinstance(section, Mapping) and "cache_capacity_gb" in section:
        new = float(section["cache_capacity_gb"])
        if new != old:
            raise error(
                f"[models].cache_limit_gb = {old:g} and [placement].cache_capacity_gb = {new:g}: the models "
                "and placement's artifacts share one cache with one capacity; remove [models].cache_limit_gb "
                "(deprecated) and keep [placement].cache_capacity_gb"
            )
        return None
    return old


def models_settings(file_cfg: Any) -> ModelsSection:
    """``[models]`` of the loaded config file (the defaults for anything that is not a ``FileConfig``)."""
    section = getattr(file_cfg, "models", None)
    return section if isinstance(section, ModelsSection) else ModelsSection()
