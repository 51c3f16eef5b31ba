"""A small blocking Server-Sent Events reader over a real socket (http.client), for the event tests."""

from __future__ import annotations

import http.client
import json
import time
from typing import Self


class SseStream:
    """``GET path`` on 127.0.0.1:``port``; :meth:`next` returns one event (``{"id", "event", "data"}``,
    ``data`` parsed as JSON) or the string ``"ping"`` for a heartbeat comment."""

    def __init__(
        self,
        port: int,
        path: str = "/api/events",
        headers: dict | None = None,
        timeout: float = 30.0,
        source: str | None = None,  # the client's own address (another loopback one: 127.0.0.2)
    ):
        self.conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=timeout, source_address=None if source is None else (source, 0)
        )
        self.conn.request("GET", path, headers=headers or {})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}

    def body(self) -> dict:
        return json.loads(self.resp.read())

    def next(self) -> dict | str:
        fields: dict = {}
        comment = False
        while True:
            raw = self.resp.readline()
            if not raw:
                raise EOFError("the event stream ended")
            line = raw.decode().rstrip("\n")
            if line == "":
                if fields:
                    fields["id"] = int(fields["id"])
                    fields["data"] = json.loads(fields["data"])
                    return fields
                if comment:
                    return "ping"
                continue
            if line.startswith(":"):
                comment = True
                continue
            name, _, value = line.partition(": ")
            assert name in ("id", "event", "data"), f"unexpected SSE field {line!r}"
            assert name not in fields, f"field {name} twice in one event"
            fields[name] = value

    def events_until(self, pred, what: str, timeout_s: float = 30.0) -> list[dict]:
        """Every event read (pings skipped) up to and including the first that satisfies ``pred``."""
        deadline = time.monotonic() + timeout_s
        seen: list[dict] = []
        while time.monotonic() < deadline:
            ev = self.next()
            if ev == "ping":
                continue
            seen.append(ev)
            if pred(ev):
                return seen
        raise TimeoutError(f"no {what} within {timeout_s} s; saw {[e['event'] for e in seen]}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
