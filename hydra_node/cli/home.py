"""The node's home directory must be usable before anything starts: one clear line if it is not."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hydra_node.config import ConfigError

__all__ = ["check_home"]

#: Folders the node writes under its home.
HOME_DIRS = ("logs", "run", "mesh")


def check_home(home: Path) -> None:
    """Create ``home`` and its folders, and prove they are writable; :class:`ConfigError` with the
    path and the reason (read-only, not a directory, no permission, disk full) otherwise."""
    try:
        for sub in ("", *HOME_DIRS):
            d = home / sub if sub else home
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, prefix=".write-check-"):
                pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = exc.filename or home
        raise ConfigError(
            f"home {home} is not usable ({reason}: {where}); choose another with --home or "
            f"HYDRA_HOME, or fix its permissions"
        ) from None
