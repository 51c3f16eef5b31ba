"""The host's memory as /proc/meminfo reports it (for placement and ``hydra-node setup``)."""

from __future__ import annotations

__all__ = ["read_meminfo"]


def read_meminfo() -> tuple[int, int]:
    """(total, available) bytes; MemAvailable counts reclaimable page cache, unlike free pages."""
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name == "MemTotal":
                    total = int(rest.split()[0]) * 1024
                elif name == "MemAvailable":
                    avail = int(rest.split()[0]) * 1024
                if total and avail:  # both near the top: skip the rest of the file
                    break
    except (OSError, ValueError, IndexError):
        pass
    return total, avail
