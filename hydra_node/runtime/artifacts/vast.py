"""The VAST DataSpace trigger, its sender: POST the payload, retry with jittered back-off (trio).

One request is a blocking ``urllib`` POST (the node's outgoing-HTTP mechanism, as in
``runtime/fetch/http_fetch.py``) run in a worker thread; the loop around it is trio, so a caller's
cancel scope ends it at once. Connection failures, 408/425/429 and 5xx are retried (waiting the
back-off, or a longer ``Retry-After``) up to ``max_attempts``; 2xx is delivered; any other status
is final. Redirects are not followed (a POST must not turn into a GET elsewhere). Every try carries
the same body and the same ``Idempotency-Key`` header, so a receiver can drop repeats.

    result = await send_trigger(settings, build_payload(manifest, op_id=op.id, settings=settings))
    if not result.delivered: op.fail("trigger_failed", result.last_error, now)
"""

from __future__ import annotations

import http.client
import logging
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import trio

from hydra_node import __version__
from hydra_node.runtime.artifacts.vast_payload import (
    IDEMPOTENCY_HEADER,
    VastSettings,
    encode_payload,
    retry_delay,
    verdict,
)

__all__ = ["MAX_REPLY_CHARS", "PostReply", "TriggerResult", "post_json", "send_trigger"]

log = logging.getLogger("hydra.placement.vast")

#: Characters of a receiver's reply kept (in ``last_error`` and the operation record).
MAX_REPLY_CHARS = 500


@dataclass(frozen=True)
class PostReply:
    """What one POST got: an HTTP ``status`` with the start of its ``body``, or ``error`` (no answer)."""

    status: int | None
    body: str = ""
    error: str | None = None
    retry_after_s: float | None = None

    def describe(self, url: str) -> str:
        if self.status is None:
            return self.error or f"no answer from {url}"
        return f"{url} answered HTTP {self.status}" + (f": {self.body}" if self.body else "")


@dataclass(frozen=True)
class TriggerResult:
    """The outcome of a trigger: ``delivered``, how many ``attempts``, the last HTTP ``status``, and
    ``last_error`` (the reason of the last failed try; None once delivered)."""

    delivered: bool
    attempts: int
    status: int | None
    last_error: str | None
    idempotency_key: str
    endpoint: str

    def to_mapping(self) -> dict[str, Any]:
        return asdict(self)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx comes back as an HTTPError: a final answer


_OPENER = urllib.request.build_opener(_NoRedirects())


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the back-off applies


def post_json(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> PostReply:
    """One blocking POST of ``body`` (JSON); never raises for a network or HTTP failure."""
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"hydra-node/{__version__}",
            **headers,
        },
    )
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            text = resp.read(MAX_REPLY_CHARS).decode("utf-8", "replace")
            return PostReply(resp.status, text, None, _retry_after(resp.headers))
    except urllib.error.HTTPError as exc:
        with exc:
            text = (exc.read(MAX_REPLY_CHARS) if exc.fp is not None else b"").decode("utf-8", "replace")
        return PostReply(exc.code, text.strip(), None, _retry_after(exc.headers))
    except urllib.error.URLError as exc:
        reason = getattr(exc.reason, "strerror", None) or exc.reason
        return PostReply(None, error=f"cannot reach {url} ({reason})")
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        return PostReply(None, error=f"{url}: the request failed ({type(exc).__name__}: {exc})")


async def send_trigger(
    settings: VastSettings, payload: Mapping[str, Any], *, rng: Callable[[], float] = random.random
) -> TriggerResult:
    """POST ``payload`` (from ``build_payload``) to ``settings.endpoint`` until it is delivered, refused
    or ``max_attempts`` tries have failed."""
    key = payload["idempotency_key"]
    body = encode_payload(payload)
    headers = {IDEMPOTENCY_HEADER: key}
    policy = settings.backoff()
    reply = PostReply(None, error="not sent")
    for attempt in range(settings.max_attempts):
        reply = await trio.to_thread.run_sync(
            partial(post_json, settings.endpoint, body, headers, settings.request_timeout_s), abandon_on_cancel=True
        )
        outcome = verdict(reply.status)
        if outcome == "delivered":
            log.info(
                "event=vast_trigger_delivered op=%s key=%s attempts=%d status=%s",
                payload.get("op_id"),
                key[:16],
                attempt + 1,
                reply.status,
            )
            return TriggerResult(True, attempt + 1, reply.status, None, key, settings.endpoint)
        reason = reply.describe(settings.endpoint)
        log.warning(
            "event=vast_trigger_failed op=%s key=%s attempt=%d outcome=%s reason=%r",
            payload.get("op_id"),
            key[:16],
            attempt + 1,
            outcome,
            reason,
        )
        if outcome == "refused":
            return TriggerResult(False, attempt + 1, reply.status, f"refused: {reason}", key, settings.endpoint)
        if attempt + 1 < settings.max_attempts:
            await trio.sleep(retry_delay(policy, attempt, rng(), reply.retry_after_s))
    return TriggerResult(
        False,
        settings.max_attempts,
        reply.status,
        f"gave up after {settings.max_attempts} tries: {reply.describe(settings.endpoint)}",
        key,
        settings.endpoint,
    )
