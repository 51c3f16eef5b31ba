"""The pure core of a download: what to ask for, what a response means, progress maths.

No sockets, no files, no clock: the IO layer (``http_fetch.py``) feeds facts in and acts on the
decisions; tests drive it with plain values.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from hydra_node.runtime.fetch.errors import (
    NotFound,
    RemoteStatusError,
    SizeMismatch,
    Unauthorized,
)

__all__ = [
    "LOOSE_SIZE_FACTOR",
    "ProgressMeter",
    "RateFloor",
    "ResponsePlan",
    "check_loose_size",
    "check_total",
    "format_bytes",
    "hub_lfs_sha256",
    "plan_response",
    "range_header",
    "same_origin",
]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
#: Rate is measured over this many most recent samples (a sliding window: the ETA follows the
#: current speed, not the average since the start).
RATE_WINDOW_SAMPLES = 20


def range_header(have: int) -> dict[str, str]:
    """Request headers for a download that already holds ``have`` bytes (none when starting afresh)."""
    return {"Range": f"bytes={have}-"} if have > 0 else {}


@dataclass(frozen=True)
class ResponsePlan:
    """What to do with a response: write from ``offset`` (0: truncate and start over; ``have``: append),
    or nothing is left to fetch (``complete``). ``total`` is the file size when the server said it;
    ``resumable``: the server takes ranges, so a partial file is worth keeping after a failure."""

    offset: int
    total: int | None
    resumable: bool
    complete: bool = False


def plan_response(have: int, status: int, headers: Mapping[str, str], url: str = "") -> ResponsePlan:
    """Decide from a response's status and headers (names lower-case); a typed
    :class:`DownloadError` for a status that carries no file."""
    h = {k.lower(): v for k, v in headers.items()}
    accepts = h.get("accept-ranges", "").strip().lower() == "bytes"
    length = _int(h.get("content-length"))
    if status == 206:
        m = _CONTENT_RANGE.fullmatch(h.get("content-range", "").strip())
        if m is None or int(m.group(1)) != have:
            raise RemoteStatusError(
                f"{url}: the server answered the range request with a bad Content-Range {h.get('content-range')!r}"
            )
        total = None if m.group(3) == "*" else int(m.group(3))
        return ResponsePlan(offset=have, total=total, resumable=True)
    if status == 200:
        return ResponsePlan(offset=0, total=length, resumable=accepts)
    if status == 416 and have > 0:
        m = re.fullmatch(r"bytes \*/(\d+)", h.get("content-range", "").strip())
        if m is not None and int(m.group(1)) == have:
            return ResponsePlan(offset=have, total=have, resumable=True, complete=True)
        raise RemoteStatusError(
            f"{url}: the server refused to resume at byte {have}; delete the partial "
            f"file with `hydra models rm` and try again"
        )
    if status == 404:
        raise NotFound(f"{url}: not found (404): check the model name, repository, revision and file")
    if status in (401, 403):
        raise Unauthorized(
            f"{url}: access denied ({status}): a gated or private repository needs HF_TOKEN "
            f"set to a token that may read it"
        )
    raise RemoteStatusError(f"{url}: the server answered HTTP {status}")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _format_eta(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class ProgressMeter:
    """Progress of one transfer from injected ``now`` values: bytes done, rate over a sliding window,
    ETA; :meth:`line` renders one progress-bar line (the IO layer writes it to stderr)."""

    def __init__(self, total: int | None, start: int, now: float) -> None:
        self.total = total
        self.done = start
        self._samples: deque[tuple[float, int]] = deque([(now, start)], maxlen=RATE_WINDOW_SAMPLES)

    def update(self, done: int, now: float) -> None:
        self.done = done
        self._samples.append((now, done))

    @property
    def rate(self) -> float:
        """Bytes per second over the window (0 until two samples are apart in time)."""
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if self.total is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def line(self, label: str, width: int = 30) -> str:
        rate = f"{format_bytes(self.rate)}/s"
        if self.total:
            frac = min(1.0, self.done / self.total)
            bar = "#" * int(frac * width)
            eta = self.eta_s
            return (
                f"{label} [{bar:<{width}}] {frac * 100:5.1f}% {format_bytes(self.done)}/"
                f"{format_bytes(self.total)} {rate} ETA {_format_eta(eta) if eta is not None else '?'}"
            )
        return f"{label} {format_bytes(self.done)} {rate}"


class RateFloor:
    """A minimum transfer rate: over every window of ``window_s`` seconds at least
    ``min_rate * window_s`` bytes must arrive. :meth:`slow` is fed the byte count and the time after
    each read; True once a whole window went by below the floor (a server trickling a byte every few
    seconds never trips a per-read timeout, but trips this). ``min_rate`` 0: never slow."""

    def __init__(self, min_rate: float, window_s: float, done: int, now: float) -> None:
        self.min_rate, self.window_s = min_rate, window_s
        self._start, self._base = now, done
        self.rate = 0.0  # of the last window that ended

    def slow(self, done: int, now: float) -> bool:
        if self.min_rate <= 0 or now - self._start < self.window_s:
            return False
        self.rate = (done - self._base) / (now - self._start)
        self._start, self._base = now, done
        return self.rate < self.min_rate


def same_origin(a: str, b: str) -> bool:
    """Scheme, host and port (the default port when none is written) are all the same."""
    pa, pb = urlsplit(a), urlsplit(b)

    def port(p) -> int | None:
        try:
            return p.port or {"http": 80, "https": 443}.get(p.scheme)
        except ValueError:
            return None

    return (pa.scheme, (pa.hostname or "").lower(), port(pa)) == (pb.scheme, (pb.hostname or "").lower(), port(pb))


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def hub_lfs_sha256(headers: Mapping[str, str]) -> str | None:
    """The sha256 the Hugging Face Hub states for an LFS file: its ``resolve`` answer carries
    ``X-Linked-Etag: "<sha256>"`` (the LFS object id; a plain ``ETag`` for a non-LFS file is a git
    blob sha1, 40 digits, and is not used). None when absent or not a sha256."""
    h = {k.lower(): v for k, v in headers.items()}
    tag = h.get("x-linked-etag", "").strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    tag = tag.strip('"').lower()
    return tag if _SHA256_HEX.fullmatch(tag) else None


#: A catalogue size without exact bytes (``approx_gb``, what the Hub page lists) is checked loosely:
#: the file must hold between 1/LOOSE_SIZE_FACTOR and LOOSE_SIZE_FACTOR times that many bytes.
LOOSE_SIZE_FACTOR = 1.25


def check_loose_size(model_id: str, approx_bytes: int | None, size: int) -> None:
    """:class:`SizeMismatch` when ``size`` is far from the catalogue's approximate size."""
    if approx_bytes is not None and not approx_bytes / LOOSE_SIZE_FACTOR <= size <= approx_bytes * LOOSE_SIZE_FACTOR:
        raise SizeMismatch(
            f"{model_id}: the file holds {size} bytes, far from the catalogue's ~{approx_bytes / 1e9:.2f} GB; "
            f"it is not that model"
        )


def check_total(expected: int | None, announced: int | None, url: str) -> None:
    """A server that announces another size than the catalogue's is serving another file."""
    if expected is not None and announced is not None and expected != announced:
        raise SizeMismatch(f"{url}: the server offers {announced} bytes, the catalogue says {expected}")
