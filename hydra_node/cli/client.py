"""The one HTTP client of the command line: every command that talks to a running node
(``status``, ``invite``, ``swap``) goes through :class:`NodeClient` to its management API.

Failures come out as one of two errors, each with the line the CLI prints:
:class:`NodeRefused` (the node answered with an HTTP error; its body is kept) and
:class:`NodeUnreachable` (nothing answered on the port).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["DEFAULT_TIMEOUT_S", "NodeClient", "NodeClientError", "NodeRefused", "NodeUnreachable"]

#: Bound on one request unless the caller gives another (a swap waits for a model load).
DEFAULT_TIMEOUT_S = 5.0
#: Longest error body kept from a refusing node.
MAX_ERROR_BODY_CHARS = 4096


class NodeClientError(Exception):
    """A request to the node failed; ``str()`` is what the CLI prints after ``hydra-node: ``."""


class NodeRefused(NodeClientError):
    def __init__(self, status: int, body: str):
        super().__init__(f"the node refused: {body}")
        self.status, self.body = status, body


class NodeUnreachable(NodeClientError):
    def __init__(self, port: int, reason: object, host: str = "127.0.0.1"):
        super().__init__(f"no node answering on {host}:{port} ({reason})")
        self.port = port


class NodeClient:
    """JSON requests to the management API on ``127.0.0.1:port`` (with ``Bearer api_key`` if set);
    ``host``: another address (the agent launchers' ``--node URL``)."""

    def __init__(self, port: int, api_key: str | None = None, host: str = "127.0.0.1"):
        self.port = port
        self.api_key = api_key
        self.host = host

    def get(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        return self.request("GET", path, None, timeout=timeout)

    def post(self, path: str, body: dict, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        return self.request("POST", path, body, timeout=timeout)

    def delete(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        return self.request("DELETE", path, None, timeout=timeout)

    def request(self, method: str, path: str, body: dict | None, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        data = None if body is None else json.dumps(body).encode()
        # The node refuses state-changing requests without a JSON content type (CSRF), even body-less ones.
        req = urllib.request.Request(
            f"http://{self.host}:{self.port}{path}",
            method=method,
            data=data,
            headers={"Content-Type": "application/json"} if method != "GET" else {},
        )
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise NodeRefused(exc.code, exc.read().decode(errors="replace")[:MAX_ERROR_BODY_CHARS]) from None
        except (urllib.error.URLError, OSError) as exc:
            raise NodeUnreachable(self.port, getattr(exc, "reason", exc), self.host) from None

    @staticmethod
    def quote(segment: str) -> str:
        """A path segment (a model id) quoted for a URL."""
        return urllib.parse.quote(segment, safe="")
