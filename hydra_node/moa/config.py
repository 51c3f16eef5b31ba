"""``[moa]``: the mixture of agents behind ``model: "mesh"`` (experimental; docs/moa.md, docs/config.md).

Parsed here (the config loader hands the table over and turns :class:`MoaConfigError` into its own
``ConfigError``), so ``hydra_node/config.py`` stays one line per section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

__all__ = ["MESH_MODEL", "MAX_MOA_MEMBERS", "MoaConfigError", "MoaSettings", "parse_moa_section"]

#: The model id that asks the mixture of agents.
MESH_MODEL = "mesh"
#: Most members one mesh request fans out to (each is a full generation somewhere in the mesh).
MAX_MOA_MEMBERS = 16
#: Longest per-member deadline accepted (an hour: past that, a member is not coming back).
MAX_DEADLINE_S = 3600.0


class MoaConfigError(ValueError):
    """A bad ``[moa]`` value; the message names the key."""


@dataclass(frozen=True)
class MoaSettings:
    enabled: bool = True
    #: Model ids asked; empty: every distinct model in the mesh (sorted by id), up to max_members.
    members: tuple[str, ...] = ()
    max_members: int = 4
    #: A member that has not finished by then is left out (its generation cancelled).
    deadline_s: float = 60.0
    #: The model asked to merge the candidates when no answer has a majority; "": no reducer.
    reducer: str = ""

    def validate(self) -> None:
        def check(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise MoaConfigError(f"[moa].{key}: {msg}")

        check(isinstance(self.enabled, bool), "enabled", f"must be true or false, not {self.enabled!r}")
        check(
            isinstance(self.members, tuple) and all(isinstance(m, str) and m for m in self.members),
            "members",
            "must be an array of model ids",
        )
        check(len(set(self.members)) == len(self.members), "members", "lists a model twice")
        check(MESH_MODEL not in self.members, "members", f"{MESH_MODEL!r} cannot be its own member")
        check(
            type(self.max_members) is int and 2 <= self.max_members <= MAX_MOA_MEMBERS,
            "max_members",
            f"must be an integer from 2 to {MAX_MOA_MEMBERS}, not {self.max_members!r}",
        )
        check(len(self.members) <= self.max_members, "members", f"lists more than max_members ({self.max_members})")
        check(
            isinstance(self.deadline_s, (int, float))
            and not isinstance(self.deadline_s, bool)
            and math.isfinite(self.deadline_s)
            and 0 < self.deadline_s <= MAX_DEADLINE_S,
            "deadline_s",
            f"must be a number of seconds in (0, {MAX_DEADLINE_S:g}], not {self.deadline_s!r}",
        )
        check(
            isinstance(self.reducer, str) and self.reducer != MESH_MODEL,
            "reducer",
            f"must be a model id (not {MESH_MODEL!r}) or \"\" for none",
        )


def parse_moa_section(data: Any, error: type[Exception] = MoaConfigError) -> MoaSettings:
    """``[moa]`` from parsed TOML; unknown keys and bad values raise ``error`` naming the key."""
    if not isinstance(data, Mapping):
        raise error("[moa]: must be a table")
    known = {f.name for f in fields(MoaSettings)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise error(f"[moa].{key}: unknown key (known: {', '.join(sorted(known))})")
        if key == "members":
            if not isinstance(value, list):
                raise error(f"[moa].members: must be an array of model ids, not {value!r}")
            value = tuple(value)
        elif key == "deadline_s" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        kwargs[key] = value
    settings = MoaSettings(**kwargs)
    try:
        settings.validate()
    except MoaConfigError as exc:
        raise error(str(exc)) from None
    return settings
