"""The pure decisions of the HTTP front door (no IO): Host (DNS rebinding), Origin and
Content-Type (CSRF), CORS, and the bearer check.

:func:`screen` looks at a request *head* (before any body is read, so ``Expect: 100-continue``
gets its final answer at once) and returns a :class:`Verdict`: answer a CORS preflight, refuse
(403 foreign Host/Origin, 415 state change without JSON, 403 a CORS-simple request from a foreign
origin on a listener without CSRF checks, i.e. the OpenAI port, 401 no key), or go on.
:func:`response_headers` is what every response to that request carries (CORS).
See ``docs/security.md``.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "GuardSettings",
    "LOOPBACK_HOSTS",
    "Verdict",
    "bearer_matches",
    "key_matches",
    "normalize_origin",
    "response_headers",
    "screen",
    "valid_host_name",
]

#: Host names a loopback listener answers to (with or without a port).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
#: Paths answered without an API key and whatever the Origin (liveness probes).
OPEN_PATHS = frozenset({"/health", "/healthz"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: How long a browser may cache a preflight answer (Chromium caps it at 7200).
PREFLIGHT_MAX_AGE_S = 600
CORS_METHODS = "GET, POST, DELETE, OPTIONS"  # DELETE: /v1/responses/{id}
DEFAULT_CORS_HEADERS = "authorization, content-type"
#: Response headers a browser script may read besides the CORS-safelisted ones.
EXPOSE_HEADERS = "retry-after, x-hydra-served-by"
_MAX_REQUEST_HEADERS_CHARS = 2048
_TOKEN_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")
_HOST_NAME = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(:[0-9]{1,5})?$")


@dataclass(frozen=True)
class GuardSettings:
    """What one listener enforces.  ``check_host``: it listens on loopback, so only loopback
    names (and ``allowed_hosts``) are valid ``Host`` values.  ``csrf``: state-changing methods
    need ``Content-Type: application/json`` and a same-origin (or no) ``Origin``.
    ``cors_origins``: origins allowed to call from a browser (``*``: any); on a listener without
    ``csrf`` (the OpenAI port) a state-changing request from any other origin must carry
    ``Content-Type: application/json`` (which a browser sends only after a preflight, refused for
    such an origin), so a page cannot drive inference with a CORS-simple request (``text/plain``,
    a form).  ``api_key``: checked on the head, before the body is read."""

    check_host: bool = True
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    csrf: bool = False
    api_key: str | None = None
    #: GET paths answered without the key (the console's static files); a trailing ``/*`` is a prefix.
    public_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """``status`` 204 is a preflight answer; anything else is a refusal with an error body."""

    status: int
    code: str = ""
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def refusal(self) -> bool:
        return self.status >= 400

    def error_body(self) -> dict:
        kind = (
            "authentication_error"
            if self.status == 401
            else ("permission_error" if self.status == 403 else "invalid_request_error")
        )
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}


def key_matches(headers: dict, key: str | None) -> bool:
    """True when no key is required, or the (lower-case) ``headers`` carry it: ``Authorization:
    Bearer KEY``, or ``x-api-key: KEY`` as Anthropic's clients send it (docs/agents.md)."""
    if bearer_matches(headers.get("authorization"), key):
        return True
    given = headers.get("x-api-key")
    # (key is not None here: without one, bearer_matches said True)
    return (
        key is not None
        and given is not None
        and hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), key.encode("utf-8"))
    )


def bearer_matches(authorization: str | None, key: str | None) -> bool:
    """True when no key is required, or ``authorization`` is ``Bearer KEY`` (scheme case-insensitive,
    RFC 7235).  Compared as bytes, so any header value (non-ASCII too) is a plain mismatch."""
    if key is None:
        return True
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), key.encode("utf-8"))


def _split_host(value: str) -> tuple[str, str | None] | None:
    """``host[:port]`` → (lower-case host, port or None); None when it is not a host name."""
    value = value.strip()
    if not _HOST_NAME.match(value):
        return None
    if value.startswith("["):
        host, _, rest = value.partition("]")
        host += "]"
        port = rest[1:] if rest.startswith(":") else None
    else:
        host, sep, port = value.partition(":")
        port = port if sep else None
    return host.lower(), port


def valid_host_name(value: str) -> bool:
    """An ``--allow-host`` value: a DNS name or bracketed IPv6, optionally with ``:port``."""
    return _split_host(value) is not None


def host_allowed(host_header: str | None, settings: GuardSettings) -> bool:
    if not settings.check_host or host_header is None:  # no Host: HTTP/1.0, never a browser
        return True
    parsed = _split_host(host_header)
    if parsed is None:
        return False
    host, _ = parsed
    if host in LOOPBACK_HOSTS:
        return True
    for entry in settings.allowed_hosts:
        allowed = _split_host(entry)
        if allowed is not None and allowed[0] == host and (allowed[1] is None or allowed[1] == parsed[1]):
            return True
    return False


def normalize_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case, or None when ``origin`` is not one (``null``, paths)."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return None
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
        or _split_host(parts.netloc) is None
    ):
        return None
    return f"{parts.scheme}://{parts.netloc.lower()}"


def _same_origin(origin: str, host_header: str | None, settings: GuardSettings) -> bool:
    norm = normalize_origin(origin)
    if norm is None:
        return False
    netloc = norm.split("://", 1)[1]
    host = _split_host(netloc)
    if host_header is not None and netloc == host_header.strip().lower():
        return True
    return host is not None and any((_split_host(e) or ("", None))[0] == host[0] for e in settings.allowed_hosts)


def _cors_allowed(origin: str | None, settings: GuardSettings) -> bool:
    if origin is None or not settings.cors_origins:
        return False
    return "*" in settings.cors_origins or normalize_origin(origin) in settings.cors_origins


def _cross_origin_simple(headers: dict, settings: GuardSettings) -> bool:
    """A request a browser may send from any page without a preflight (``Origin`` foreign to this
    node and not allowed by CORS, a body that is not ``application/json``)."""
    origin = headers.get("origin")
    return (
        origin is not None
        and _media_type(headers) != "application/json"
        and not _cors_allowed(origin, settings)
        and not _same_origin(origin, headers.get("host"), settings)
    )


def _media_type(headers: dict) -> str:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def response_headers(headers: dict, settings: GuardSettings) -> list[tuple[str, str]]:
    """CORS headers for a response to a request with these (lower-case) ``headers``."""
    if not settings.cors_origins:
        return []
    origin = headers.get("origin")
    out = [("vary", "Origin")]
    if origin is not None and _cors_allowed(origin, settings):
        out.append(("access-control-allow-origin", "*" if "*" in settings.cors_origins else origin.strip()))
        out.append(("access-control-expose-headers", EXPOSE_HEADERS))
    return out


def _preflight(headers: dict, settings: GuardSettings) -> Verdict:
    origin = headers.get("origin")
    if not _cors_allowed(origin, settings):
        return Verdict(
            403,
            "cors_origin_not_allowed",
            f"origin {origin!r} may not call this API from a browser (see --cors-origin)",
        )
    asked = headers.get("access-control-request-headers", "").strip()
    allow = (
        asked.lower()
        if asked and len(asked) <= _MAX_REQUEST_HEADERS_CHARS and _TOKEN_LIST.match(asked)
        else DEFAULT_CORS_HEADERS
    )
    extra = [
        ("access-control-allow-methods", CORS_METHODS),
        ("access-control-allow-headers", allow),
        ("access-control-max-age", str(PREFLIGHT_MAX_AGE_S)),
    ]
    if headers.get("access-control-request-private-network", "").lower() == "true":
        extra.append(("access-control-allow-private-network", "true"))
    return Verdict(204, headers=tuple(response_headers(headers, settings) + extra))


def screen(method: str, path: str, headers: dict, settings: GuardSettings) -> Verdict | None:
    """The verdict on a request head (``headers``: lower-case names), or None to go on."""
    if not host_allowed(headers.get("host"), settings):
        return Verdict(
            403,
            "forbidden_host",
            "this node answers only to its own host names (127.0.0.1, localhost, [::1]); add others with --allow-host",
        )
    if method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers:
        return _preflight(headers, settings)  # before the key: browsers never send one in a preflight
    norm = path.rstrip("/") or "/"
    if settings.csrf and method in STATE_CHANGING:
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, headers.get("host"), settings):
            return Verdict(403, "forbidden_origin", f"requests from origin {origin!r} may not change this node")
        if _media_type(headers) != "application/json":
            return Verdict(415, "unsupported_media_type", f"{method} requests need 'Content-Type: application/json'")
    elif method in STATE_CHANGING and _cross_origin_simple(headers, settings):
        ctype = headers.get("content-type")
        return Verdict(
            403,
            "cross_origin_request",
            f"a {method} from origin {headers.get('origin')!r} with "
            f"{'no Content-Type' if ctype is None else f'Content-Type {ctype.strip()!r:.80}'}: a page on another "
            "origin may not send requests a browser does not ask about first; send 'Content-Type: "
            "application/json' (a browser then sends a preflight, answered for allowed origins only), and "
            "allow the page's origin with --cors-origin / [api].cors_origins; a client that is not a "
            "browser can leave out the Origin header",
        )
    public = method == "GET" and any(
        norm == p or (p.endswith("/*") and path.startswith(p[:-1])) for p in settings.public_paths
    )
    if norm not in OPEN_PATHS and not public and not key_matches(headers, settings.api_key):
        return Verdict(
            401, "invalid_api_key", "missing or invalid API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')"
        )
    return None
