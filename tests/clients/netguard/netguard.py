"""No client may phone home: refuse, and record, every connection that leaves the loopback.

`install()` wraps ``socket.getaddrinfo`` and ``socket.socket.connect``/``connect_ex`` (what
every HTTP stack here ends in: httpx, httpx2, aiohttp, requests, asyncio, trio) so that a name
or address outside 127.0.0.0/8 and ::1 fails at once, as it would on a machine with no network,
and is remembered in :data:`attempts`. The client tests assert the list stays empty.
Unix sockets and unconnected lookups (host None: a local bind) pass untouched.
"""

from __future__ import annotations

import atexit
import errno
import ipaddress
import json
import socket

__all__ = ["attempts", "install", "is_loopback", "uninstall"]

#: ``"host:port (what)"`` for every refused attempt, in order.
attempts: list[str] = []
_real: tuple | None = None  # what install() replaced, while installed


def is_loopback(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").split("%")[0]
    if host in ("", "localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def install(record_path: str | None = None) -> None:
    """Guard this process; with ``record_path``, write the attempts there (JSON) when it exits."""
    global _real
    if _real is not None:
        return
    _real = real_getaddrinfo, real_connect, real_connect_ex = (
        socket.getaddrinfo,
        socket.socket.connect,
        socket.socket.connect_ex,
    )

    def getaddrinfo(host, port, *args, **kwargs):
        if not is_loopback(host):
            attempts.append(f"{host}:{port} (name lookup)")
            raise socket.gaierror(socket.EAI_NONAME, f"{host}: refused by the client tests' network guard")
        return real_getaddrinfo(host, port, *args, **kwargs)

    def _check(sock: socket.socket, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not is_loopback(address[0]):
            attempts.append(f"{address[0]}:{address[1]} (connect)")
            raise OSError(errno.ENETUNREACH, f"{address[0]}: refused by the client tests' network guard")

    def connect(self, address):
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        _check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    if record_path:
        atexit.register(lambda: _write(record_path))


def uninstall() -> None:
    """Put back what :func:`install` replaced (the rest of a test run may use other addresses)."""
    global _real
    if _real is not None:
        socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex = _real
        _real = None


def _write(path: str) -> None:
    with open(path, "w") as f:
        json.dump(attempts, f)
