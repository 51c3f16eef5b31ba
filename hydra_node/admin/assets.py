"""The web console's static files (``hydra_node/admin/console/``), served on the management port.

:class:`ConsoleAssets` reads the files once, from package data, into memory (bounded by
:data:`MAX_CONSOLE_BYTES`), and answers ``GET /``, ``/dashboard`` (the page) and
``/console/<file>`` (its scripts and style) with their content type, a strong ``ETag``
(``304`` on a matching ``If-None-Match``) and ``Cache-Control: no-cache`` (the browser keeps a
copy but revalidates, so an upgraded node never serves a stale script).  Every answer carries a
``Content-Security-Policy`` allowing only this origin (no inline script, no CDN).

The files are not secret: these paths are readable without the API key (:data:`PUBLIC_PATHS`,
handed to the HTTP guard by the composition root); the page asks for the key and sends it as a
Bearer header on every API call.  ``--headless``: every console path is a 404.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Mapping

from hydra_node.http.messages import Response, error_body

__all__ = ["CONSOLE_PREFIX", "ConsoleAssets", "MAX_CONSOLE_BYTES", "PAGE_PATHS", "PUBLIC_PATHS", "load_assets"]

#: The whole console (scripts, style, page) must stay small: the issue's goal is 200 KB uncompressed.
MAX_CONSOLE_BYTES = 200 * 1024
#: Paths that answer the page itself.
PAGE_PATHS = frozenset({"/", "/dashboard"})
#: Where the page's scripts and style live.
CONSOLE_PREFIX = "/console/"
#: What the HTTP guard lets through without the API key (GET only; a trailing ``/*`` is a prefix).
PUBLIC_PATHS = (*sorted(PAGE_PATHS), CONSOLE_PREFIX + "*")
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_SECURITY_HEADERS = (
    ("content-security-policy", _CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
)


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def _asset(name: str, body: bytes) -> Asset:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if suffix not in _TYPES:
        raise ValueError(f"console file {name!r} has no known content type")
    return Asset(body, _TYPES[suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')


def load_assets(package: str = "hydra_node.admin", folder: str = "console") -> dict[str, Asset]:
    """Every file under the package folder, by its path relative to it (``pages/mesh.js``)."""
    out: dict[str, Asset] = {}

    def walk(node, prefix: str) -> None:
        for entry in sorted(node.iterdir(), key=lambda e: e.name):
            if entry.name.startswith((".", "_")):
                continue
            if entry.is_dir():
                walk(entry, prefix + entry.name + "/")
            else:
                out[prefix + entry.name] = _asset(entry.name, entry.read_bytes())

    walk(resources.files(package) / folder, "")
    if "index.html" not in out:
        raise ValueError("the console has no index.html")
    total = sum(len(a.body) for a in out.values())
    if total > MAX_CONSOLE_BYTES:
        raise ValueError(f"the console is {total} bytes, over its {MAX_CONSOLE_BYTES}-byte bound")
    return out


class ConsoleAssets:
    """Answers console paths; :meth:`respond` is None for any other path (the API's routes)."""

    def __init__(self, assets: Mapping[str, Asset] | None = None, *, headless: bool = False):
        self.headless = headless
        self.assets = dict(assets) if assets is not None else ({} if headless else load_assets())

    @property
    def total_bytes(self) -> int:
        return sum(len(a.body) for a in self.assets.values())

    def respond(self, method: str, path: str, headers: Mapping[str, str]) -> Response | None:
        norm = path.rstrip("/") or "/"
        if norm in PAGE_PATHS:
            name = "index.html"
        elif path.startswith(CONSOLE_PREFIX):
            name = path[len(CONSOLE_PREFIX) :]
        else:
            return None
        if self.headless:
            return Response(404, error_body("console disabled (--headless)", "not_found"))
        if method != "GET":
            return Response(
                405,
                error_body(f"{method} is not allowed on the console", "method_not_allowed"),
                headers=[("allow", "GET")],
            )
        asset = self.assets.get(name)
        if asset is None:
            return Response(404, error_body(f"no console file {name!r}", "not_found"))
        common = [("etag", asset.etag), ("cache-control", "no-cache"), *_SECURITY_HEADERS]
        if asset.etag in {t.strip() for t in headers.get("if-none-match", "").split(",")}:
            return Response(304, b"", asset.content_type, common)
        return Response(200, asset.body, asset.content_type, common)
