"""Images of a chat, resolved on the node that received the request (docs/vision.md).

:func:`resolve_images` turns every :class:`ImageInput` a parser found (:mod:`hydra_node.api.image_parts`)
into the :class:`ImageBlob` the host is sent: the bytes checked and, where needed, converted by
:func:`hydra_node.api.image_decode.decode_image` in a worker thread; an http(s) URL fetched first by
:func:`fetch_image` (also in a worker thread, the stdlib's ``http.client``), under
:class:`ImagePolicy`:

* a deadline for the whole download, redirects included (``[api] image_fetch_timeout_s``, 10 s);
* at most :data:`MAX_IMAGE_BYTES`, enforced while the body streams (a larger ``Content-Length`` is
  refused before reading);
* at most :data:`MAX_REDIRECTS` redirects, each only to http or https and checked like the first URL;
* the host name resolved once per hop, and every address it resolves to must be public (not private,
  loopback, link-local, shared, reserved or multicast) unless ``[api] image_fetch_private = true``;
  the connection goes to the checked address (TLS still verifies the certificate for the host name),
  so a second, different DNS answer cannot slip in between the check and the connection.

Every error is a 400 naming the image part (``param``) and, for a fetch, the URL's host and why.
The routes call :func:`resolve_images` after parsing and before routing; ``model: "mesh"`` with
images is refused (:func:`refuse_mesh_images`). :func:`check_body_size` keeps the text of a request
within the 8 MiB it had before images (the inference port admits :data:`INFERENCE_BODY_BYTES`).
"""

from __future__ import annotations

import dataclasses
import http.client
import ipaddress
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from urllib.parse import urljoin, urlsplit

import trio

from hydra_node import __version__
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.image_decode import decode_image
from hydra_node.http.limits import INFERENCE_BODY_BYTES, TEXT_BODY_BYTES
from hydra_node.inference import GenerationRequest, InvalidRequest
from hydra_node.inference.images import MAX_IMAGE_BYTES, MAX_REQUEST_IMAGE_BYTES, ImageBlob, ImageInput

__all__ = [
    "IMAGE_PATHS",
    "INFERENCE_BODY_BYTES",
    "MAX_REDIRECTS",
    "TEXT_BODY_BYTES",
    "ImagePolicy",
    "check_body_size",
    "fetch_image",
    "is_public_address",
    "refuse_mesh_images",
    "resolve_images",
]

#: The inference routes whose bodies may carry images (and so may be larger than TEXT_BODY_BYTES).
IMAGE_PATHS = frozenset(
    {"/v1/chat/completions", "/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}
)
#: Most redirects one image download follows.
MAX_REDIRECTS = 5
_READ = 64 * 1024
_REDIRECTS = (301, 302, 303, 307, 308)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class ImagePolicy:
    """How this node fetches image URLs (``[api]`` image_fetch_private, image_fetch_timeout_s)."""

    fetch_private: bool = False
    fetch_timeout_s: float = 10.0


def is_public_address(ip: str) -> bool:
    """True for an address anyone on the internet may reach (never private, loopback, link-local,
    shared 100.64/10, reserved, multicast or unspecified; IPv4-mapped, 6to4 and NAT64 forms are
    judged by the IPv4 address they hold)."""
    try:
        a: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(a, ipaddress.IPv6Address):
        inner = a.ipv4_mapped or a.sixtofour or (ipaddress.IPv4Address(int(a) & 0xFFFFFFFF) if a in _NAT64 else None)
        if inner is not None:
            a = inner
    if isinstance(a, ipaddress.IPv6Address) and a.is_site_local:  # fec0::/10, deprecated but still routed inside sites
        return False
    return a.is_global and not (a.is_multicast or a.is_reserved or a.is_unspecified or a.is_link_local)


def _shown(url: str) -> str:
    return repr(url if len(url) <= 120 else url[:117] + "...")


def _resolve(host: str, port: int, where: str, allow_private: bool) -> list[str]:
    """The addresses to try, in order, for ``host`` (every one checked: module doc)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise bad(
            f"{where}: the image URL's host {host!r:.80} could not be resolved ({exc})", where, "image_fetch_failed"
        ) from None
    addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addrs:
        raise bad(f"{where}: the image URL's host {host!r:.80} has no address", where, "image_fetch_failed")
    if not allow_private and not all(is_public_address(a) for a in addrs):
        raise bad(
            f"{where}: the image URL's host {host!r:.80} resolves to a private, loopback or otherwise non-public "
            "address; this node fetches images only from public addresses (its operator may set "
            "[api] image_fetch_private = true)",
            where,
            "image_url_refused",
        )
    return addrs


class _Watchdog:
    """Shuts the download's socket down at the deadline, so no read (headers or body, trickled a
    byte at a time) outlives ``[api] image_fetch_timeout_s``; ``fired`` tells the timeout apart."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(timeout_s, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            fired = self.fired
        if fired:
            self._shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._sock
        if sock is not None:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def _connection(
    scheme: str, host: str, port: int, addrs: list[str], left: Callable[[], float], watch: _Watchdog
) -> http.client.HTTPConnection:
    conn: http.client.HTTPConnection
    timeout = left()
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def connect_checked(address, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
        error: OSError | None = None
        for addr in addrs:  # each checked address in turn, as socket.create_connection does
            try:
                sock = socket.create_connection((addr, address[1]), left(), source_address)
            except OSError as exc:
                if isinstance(exc, TimeoutError) and watch.fired:
                    raise
                error = exc
                continue
            watch.watch(sock)
            return sock
        assert error is not None
        raise error

    conn._create_connection = connect_checked  # type: ignore[attr-defined]  # to the checked address only
    return conn


def fetch_image(
    url: str,
    where: str,
    *,
    allow_private: bool = False,
    timeout_s: float = 10.0,
    max_bytes: int = MAX_IMAGE_BYTES,
    clock=time.monotonic,
) -> bytes:
    """Download ``url`` under the rules of the module doc (blocking). Raises ApiError (400)."""
    watch = _Watchdog(timeout_s)
    try:
        return _fetch(url, where, allow_private, timeout_s, max_bytes, clock, watch)
    finally:
        watch.cancel()


def _fetch(
    url: str,
    where: str,
    allow_private: bool,
    timeout_s: float,
    max_bytes: int,
    clock: Callable[[], float],
    watch: _Watchdog,
) -> bytes:
    deadline = clock() + timeout_s
    current = url
    host: str | None = urlsplit(url).hostname or "?"

    def left() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    previous_scheme = ""
    for _hop in range(MAX_REDIRECTS + 1):
        try:
            parts = urlsplit(current)
        except ValueError:
            raise bad(f"{where}: the image URL {_shown(current)} is not a valid URL", where, "invalid_value") from None
        scheme = parts.scheme.lower()
        if _hop and scheme == "http" and previous_scheme == "https":
            raise bad(
                f"{where}: fetching {_shown(url)} was redirected from https:// to http:// ({host}); "
                "a download that started over TLS is not followed to plain HTTP",
                where,
                "image_fetch_failed",
            )
        previous_scheme = scheme
        if scheme not in ("http", "https"):
            raise bad(
                f"{where}: fetching {_shown(url)} was redirected to a {scheme or 'relative'}: URL; "
                "only http:// and https:// are followed",
                where,
                "image_fetch_failed",
            )
        try:
            host, port = parts.hostname, parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            host, port = None, 0
        if not host:
            raise bad(f"{where}: the image URL {_shown(current)} has no valid host and port", where, "invalid_value")
        if parts.username is not None or parts.password is not None:
            raise bad(f"{where}: an image URL may not carry credentials (user:password@)", where, "invalid_value")
        try:
            addrs = _resolve(host, port, where, allow_private)
            left()  # the name lookup counts against the deadline too
            conn = _connection(scheme, host, port, addrs, left, watch)
            try:
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                conn.request(
                    "GET",
                    target,
                    headers={
                        "User-Agent": f"hydra-node/{__version__}",
                        "Accept": "image/*",
                        "Accept-Encoding": "identity",
                    },
                )
                resp = conn.getresponse()
                if resp.status in _REDIRECTS:
                    location = resp.getheader("location")
                    if not location:
                        raise bad(
                            f"{where}: {host} answered HTTP {resp.status} without a Location",
                            where,
                            "image_fetch_failed",
                        )
                    current = urljoin(current, location.strip())
                    continue
                if resp.status != 200:
                    raise bad(
                        f"{where}: fetching the image from {host} failed: HTTP {resp.status} {resp.reason}"[:300],
                        where,
                        "image_fetch_failed",
                    )
                declared = resp.getheader("content-length")
                if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
                    raise _too_large(where, host, max_bytes)
                chunks, size = [], 0
                while True:
                    if conn.sock is not None:
                        conn.sock.settimeout(left())
                    chunk = resp.read(_READ)
                    if watch.fired:
                        raise TimeoutError
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > max_bytes:
                        raise _too_large(where, host, max_bytes)
                    chunks.append(chunk)
                left()
                return b"".join(chunks)
            finally:
                conn.close()
        except (TimeoutError, socket.timeout):
            raise _timed_out(where, host, timeout_s) from None
        except (OSError, http.client.HTTPException) as exc:
            if watch.fired:  # the watchdog shut the socket down: whatever broke, it is the deadline
                raise _timed_out(where, host, timeout_s) from None
            raise bad(
                f"{where}: fetching the image from {host} failed ({str(exc)[:120] or type(exc).__name__})",
                where,
                "image_fetch_failed",
            ) from None
        except ValueError as exc:  # http.client.InvalidURL, a path that is not ASCII
            raise bad(
                f"{where}: the image URL {_shown(current)} is not a valid URL ({str(exc)[:120]})",
                where,
                "invalid_value",
            ) from None
    raise bad(f"{where}: fetching {_shown(url)} took more than {MAX_REDIRECTS} redirects", where, "image_fetch_failed")


def _timed_out(where: str, host: str, timeout_s: float) -> ApiError:
    return bad(
        f"{where}: fetching the image from {host} took longer than {timeout_s:g} s ([api] image_fetch_timeout_s)",
        where,
        "image_fetch_failed",
    )


def _too_large(where: str, host: str, limit: int) -> ApiError:
    return bad(
        f"{where}: the image at {host} is more than {limit} bytes (the largest image file accepted)",
        where,
        "image_too_large",
    )


#: Image downloads in worker threads at once, node-wide (trio's default pool has 40 threads for all
#: of the node's thread work: slow URLs must not take them all).
FETCH_LIMITER = trio.CapacityLimiter(8)
#: Image decodes at once, node-wide: one decode of the largest image holds ~160 MB (docs/vision.md).
DECODE_LIMITER = trio.CapacityLimiter(2)


async def _resolve_one(image: ImageInput, policy: ImagePolicy) -> ImageBlob:
    data = image.data
    if image.url:
        url = image.url
        fetch = partial(
            fetch_image, url, image.where, allow_private=policy.fetch_private, timeout_s=policy.fetch_timeout_s
        )
        with trio.move_on_after(policy.fetch_timeout_s + 0.5) as scope:  # the name lookup cannot be interrupted
            data = await trio.to_thread.run_sync(fetch, abandon_on_cancel=True, limiter=FETCH_LIMITER)
        if scope.cancelled_caught:
            raise _timed_out(image.where, urlsplit(url).hostname or "?", policy.fetch_timeout_s)
        if not data:
            raise bad(f"{image.where}: the image URL answered an empty body", image.where, "invalid_image")
    decode = partial(decode_image, data, image.where, declared=image.media_type, detail=image.detail)
    return await trio.to_thread.run_sync(decode, abandon_on_cancel=True, limiter=DECODE_LIMITER)


async def resolve_images(req: GenerationRequest, policy: ImagePolicy) -> GenerationRequest:
    """``req`` with every image resolved (module doc); URLs are fetched at the same time (at most
    :data:`FETCH_LIMITER` node-wide, each under ``policy.fetch_timeout_s``). Raises ApiError (400)
    naming the first part (in request order) that failed."""
    if req.images_resolved:
        return req
    out: list[ImageBlob | None] = [im if isinstance(im, ImageBlob) else None for im in req.images]
    errors: dict[int, ApiError] = {}

    async def one(i: int, image: ImageInput) -> None:
        try:
            out[i] = await _resolve_one(image, policy)
        except ApiError as exc:
            errors[i] = exc

    async with trio.open_nursery() as nursery:
        for i, im in enumerate(req.images):
            if isinstance(im, ImageInput):
                nursery.start_soon(one, i, im)
    if errors:
        raise errors[min(errors)]
    blobs = [b for b in out if b is not None]
    total = 0
    for im, blob in zip(req.images, blobs):
        total += len(blob.data)
        if total > MAX_REQUEST_IMAGE_BYTES:
            where = im.where if isinstance(im, ImageInput) else "messages"
            raise bad(
                f"{where}: the request's images are more than {MAX_REQUEST_IMAGE_BYTES} bytes in all",
                where,
                "image_too_large",
            )
    try:
        return dataclasses.replace(req, images=tuple(blobs))
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None


def check_body_size(body_bytes: int, images: Sequence[object]) -> None:
    """A 413 when the body, less its images' base64, is over :data:`TEXT_BODY_BYTES` (the text
    limit of every inference route; the port admits bodies up to :data:`INFERENCE_BODY_BYTES` for
    the images)."""
    inline = sum(4 * math.ceil(len(im.data) / 3) for im in images if isinstance(im, ImageInput))
    if body_bytes - inline > TEXT_BODY_BYTES:
        raise ApiError(
            413,
            f"request body exceeds {TEXT_BODY_BYTES} bytes besides its images",
            "request_too_large",
        )


def refuse_mesh_images(images: Sequence[object]) -> None:
    """``model: "mesh"`` (the mixture of agents) does not take images: a 400 naming ``model``."""
    if images:
        raise bad(
            "the model 'mesh' (the mixture of agents) does not take images: ask a vision model by its id "
            "(GET /v1/models lists each model's caps)",
            "model",
            "unsupported_parameter",
        )
