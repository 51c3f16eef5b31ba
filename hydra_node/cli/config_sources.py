"""Where the configuration comes from: the default file, ``--config``, flags, and each value's source.

Layering, lowest first: the built-in defaults < ``<home>/config.toml`` (read when present) <
``--config FILE`` < command-line flags.  Tables merge key by key; a key set in a later layer
replaces the earlier value (arrays are replaced whole, not concatenated).  The merged tables
are validated once, as one file would be (``hydra_node.config.parse_config_data``), so a rule
that spans keys (a quantized V cache needs flash attention) holds across files too.

:func:`value_sources` compares the effective :class:`FileConfig` with the layers and names,
for every key, where its value came from: ``default``, a file path, or ``flag``.  Pure apart
from reading the files in :func:`load_layered`.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hydra_node.config import ConfigError, FileConfig, parse_config_data

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "LayeredConfig",
    "ValueSource",
    "default_config_path",
    "flatten",
    "load_layered",
    "merge_tables",
    "value_sources",
]

#: The default file's name under the home (``~/.hydra/config.toml``).
DEFAULT_CONFIG_NAME = "config.toml"
#: Largest config file read (a config is a few KB; anything bigger is not one).
MAX_CONFIG_BYTES = 1 << 20


def default_config_path(home: Path) -> Path:
    return home / DEFAULT_CONFIG_NAME


@dataclass(frozen=True)
class LayeredConfig:
    """The merged files: the typed config, the files read (lowest first) and each one's tables."""

    file: FileConfig
    files: tuple[str, ...]
    layers: tuple[tuple[str, Mapping[str, Any]], ...]


@dataclass(frozen=True)
class ValueSource:
    key: str  # dotted, e.g. "defaults.model_fit.ctx_size"
    value: Any
    source: str  # "default", a file path, or "flag"


def read_table(path: Path, what: str) -> dict[str, Any]:
    """One TOML file's tables; :class:`ConfigError` naming the file (and ``what`` it is) otherwise."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_CONFIG_BYTES} bytes; not a config file")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{what} {path}: not valid TOML: {exc}") from None


def merge_tables(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: tables merge recursively, every other value is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = value
    return out


def load_layered(home: Path, explicit: str | None) -> LayeredConfig:
    """``<home>/config.toml`` when present, then ``explicit`` (``--config``, which must exist)."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    default = default_config_path(home)
    if default.is_file():
        layers.append((str(default), read_table(default, "default config")))
    if explicit is not None:
        p = Path(explicit).expanduser()
        if p.resolve() != default.resolve() or not layers:
            layers.append((str(p), read_table(p, "--config")))
    merged: dict[str, Any] = {}
    for _, table in layers:
        merged = merge_tables(merged, table)
    try:
        cfg = parse_config_data(merged)
    except ConfigError as exc:
        where = " + ".join(src for src, _ in layers)
        raise ConfigError(f"{exc} (in {where})" if where else str(exc)) from None
    return LayeredConfig(file=cfg, files=tuple(src for src, _ in layers), layers=tuple(layers))


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a config dataclass tree by dotted key (computed fields left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if f.metadata.get("computed"):
            continue
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, key + "."))
        else:
            out[key] = _plain(value)
    return out


def _lookup(table: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = table
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def value_sources(effective: FileConfig, layered: LayeredConfig) -> list[ValueSource]:
    """Each key of ``effective`` with its source: the last file that sets it, ``flag`` when the
    value differs from what the files (or the defaults) give, else ``default``."""
    from_files = flatten(layered.file)
    out = []
    for key, value in flatten(effective).items():
        source = "default"
        for path, table in layered.layers:
            if _lookup(table, key)[0]:
                source = path
        if value != from_files.get(key):
            source = "flag"
        out.append(ValueSource(key, value, source))
    return out
