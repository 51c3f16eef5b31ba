"""``[models]`` in the config file: the model cache and where models come from (docs/models.md).

The config loader (``hydra_node/config.py``) calls :func:`parse_models_section` with its own error
type, so a bad key or value is one ``configuration error`` line naming the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["MAX_READ_TIMEOUT_S", "ModelsSection", "models_settings", "parse_models_section"]

#: Upper bound on ``read_timeout_s`` (an hour without a byte is a dead server).
MAX_READ_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ModelsSection:
    #: Most bytes the downloaded models may take under ``<home>/models`` (0: no limit). Making room
    #: evicts the least recently used models that are neither kept (``pull --keep``) nor in use.
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

    @property
    def cache_limit_bytes(self) -> int | None:
        return int(self.cache_limit_gb * 1e9) if self.cache_limit_gb > 0 else None


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


def models_settings(file_cfg: Any) -> ModelsSection:
    """``[models]`` of the loaded config file (the defaults for anything that is not a ``FileConfig``)."""
    section = getattr(file_cfg, "models", None)
    return section if isinstance(section, ModelsSection) else ModelsSection()
