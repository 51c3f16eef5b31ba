"""A small TOML line editor: set keys in a config file's text, keeping every comment, blank line and
other key as it was (``benchmark tune --apply``).  Not a re-dump.

:func:`set_keys` replaces the value of ``name = ...`` inside ``[table]`` (keeping a trailing
comment), adds ``name = value`` after the table's last key when it is missing, and appends the
table at the end when there is none.  The result is parsed again and must hold exactly the old
data with the new values; anything it cannot edit that way (a multi-line value, a key written as a
dotted key or inline table elsewhere) raises :class:`TomlEditError` naming the key, and nothing is
written.  Pure: text in, text out.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any, Mapping

__all__ = ["TomlEditError", "set_keys", "toml_value"]

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\- \"]+?)\s*\]\s*(#.*)?$")
_ARRAY_HEADER = re.compile(r"^\s*\[\[")


class TomlEditError(ValueError):
    """The file cannot be edited line by line safely; the message names the key and why."""


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what config values hold
    raise TomlEditError(f"cannot write a {type(value).__name__} value")


def _table_name(line: str) -> str | None:
    if _ARRAY_HEADER.match(line):
        return "[["  # an array of tables: never ours
    m = _HEADER.match(line)
    return ".".join(part.strip().strip('"') for part in m.group(1).split(".")) if m else None


def _split_value(rest: str) -> tuple[str, str] | None:
    """``rest`` after ``=``: (value, trailing comment incl. its spaces), or None when not one line."""
    for i, ch in enumerate(rest):
        if ch == "#" and _parses(rest[:i]):
            j = len(rest[:i].rstrip())
            return rest[:j], rest[j:]
    return (rest.rstrip(), "") if _parses(rest) else None


def _parses(value: str) -> bool:
    try:
        tomllib.loads(f"x = {value}")
        return True
    except tomllib.TOMLDecodeError:
        return False


def _set_one(lines: list[str], table: str, name: str, value: str) -> None:
    start = None
    end = len(lines)
    for i, line in enumerate(lines):
        t = _table_name(line)
        if t is None:
            continue
        if start is not None:
            end = i
            break
        if t == table:
            start = i
    key = re.compile(rf'^(\s*)("?){re.escape(name)}\2\s*=(.*)$')
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [f"[{table}]", f"{name} = {value}"]
        return
    last = start
    for i in range(start + 1, end):
        m = key.match(lines[i])
        if m:
            split = _split_value(m.group(3))
            if split is None:
                raise TomlEditError(f"[{table}].{name}: its value spans lines; edit it by hand")
            lines[i] = f"{m.group(1)}{m.group(2)}{name}{m.group(2)} = {value}{split[1]}"
            return
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            last = i
    lines.insert(last + 1, f"{name} = {value}")


def _expected(data: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(data, default=str))
    for dotted, value in keys.items():
        node = out
        *tables, name = dotted.split(".")
        for t in tables:
            node = node.setdefault(t, {})
        node[name] = value
    return out


def set_keys(text: str, keys: Mapping[str, Any]) -> str:
    """``text`` with each dotted key (``"defaults.model_fit.ctx_size"``) set to its value."""
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlEditError(f"the file is not valid TOML ({exc}); fix it first") from None
    lines = text.splitlines()
    for dotted, value in keys.items():
        table, _, name = dotted.rpartition(".")
        if not table or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise TomlEditError(f"{dotted}: not a key inside a table")
        _set_one(lines, table, name, toml_value(value))
    out = "\n".join(lines) + "\n"
    try:
        after = tomllib.loads(out)
    except tomllib.TOMLDecodeError as exc:
        raise TomlEditError(f"editing would break the file ({exc}): a key set as a dotted key or inline "
                            f"table in another table? edit {', '.join(keys)} by hand") from None
    if json.loads(json.dumps(after, default=str)) != _expected(before, keys):
        raise TomlEditError(f"editing would change other keys; edit {', '.join(keys)} by hand")
    return out
