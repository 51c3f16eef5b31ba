"""Binding a node's TCP listeners, with an error that says which port, what for, and how to change it.

The node binds every listener it opens at start (the OpenAI API, the management API, the peer
links, the tunnel data port) before it loads models or joins a mesh, and serves them later: a
port held by another program then stops the start at once, with one line naming the port and
the option that moves it, instead of an ``[Errno 98]`` after the node already joined.

An HTTP listener on the IPv4 loopback (the default) also binds the IPv6 loopback on the same port
(``dual_loopback``), so ``http://[::1]:PORT`` and clients that resolve ``localhost`` to ``::1``
first reach it (docs/security.md lists both). A machine without IPv6 loopback keeps the IPv4
listener alone; ``::1``'s port held by another program is :class:`PortInUse` naming ``::1``.
"""

from __future__ import annotations

import errno
import logging
import socket
from dataclasses import dataclass

import trio

__all__ = ["IPV6_LOOPBACK", "ListenError", "ListenPurpose", "PortInUse", "bind_tcp", "close_listeners"]

log = logging.getLogger("hydra.listen")

IPV4_LOOPBACK = "127.0.0.1"
IPV6_LOOPBACK = "::1"
#: Errors that mean "this machine has no IPv6 loopback" (the IPv4 listener then serves alone).
_NO_IPV6 = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT})
#: Ports the kernel picks (port 0) for IPv4 whose ``::1`` twin was taken before we retry no more.
_EPHEMERAL_TRIES = 8


@dataclass(frozen=True)
class ListenPurpose:
    """What a listener is for, as an error message names it: ``what`` ("the OpenAI API") and the
    command-line option that chooses its port (``--port``)."""

    what: str
    option: str


class ListenError(Exception):
    """A listener could not be bound; the message names the address, the purpose and the option."""

    def __init__(self, host: str, port: int, purpose: ListenPurpose, cause: OSError):
        self.host, self.port, self.purpose, self.errno = host, port, purpose, cause.errno
        super().__init__(f"port {port} on {host} ({purpose.what}) {self._reason(cause)}")

    def _reason(self, cause: OSError) -> str:
        change = f"choose another port with {self.purpose.option} N"
        if cause.errno == errno.EACCES:
            return f"cannot be bound: permission denied (ports below 1024 need privileges); {change}"
        if cause.errno == errno.EADDRNOTAVAIL:
            return f"cannot be bound: {self.host} is not an address of this machine"
        return f"cannot be bound: {cause.strerror or cause}; {change}"


class PortInUse(ListenError):
    """The port is held by another process (EADDRINUSE)."""

    def _reason(self, cause: OSError) -> str:
        return (
            f"is in use: another hydra-node or program holds it; stop it or choose another port "
            f"with {self.purpose.option} N"
        )


async def bind_tcp(
    host: str, port: int, purpose: ListenPurpose, *, dual_loopback: bool = False
) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners(port, host=host)``, raising :class:`PortInUse` / :class:`ListenError`
    instead of a bare OSError.  The listeners are not served yet: hand them to ``trio.serve_listeners``.

    ``dual_loopback`` and ``host`` 127.0.0.1: ``::1`` on the same port too (see the module doc)."""
    for attempt in range(_EPHEMERAL_TRIES):
        listeners = await _bind(host, port, purpose)
        if not (dual_loopback and host == IPV4_LOOPBACK):
            return listeners
        bound = listeners[0].socket.getsockname()[1]
        try:
            return listeners + await trio.open_tcp_listeners(bound, host=IPV6_LOOPBACK)
        except OSError as exc:
            if isinstance(exc, socket.gaierror) or exc.errno in _NO_IPV6:
                log.info("event=no_ipv6_loopback port=%s what=%r error=%r", bound, purpose.what, exc)
                return listeners
            close_listeners(listeners)
            if exc.errno == errno.EADDRINUSE and port == 0 and attempt + 1 < _EPHEMERAL_TRIES:
                continue  # the kernel's pick for IPv4 is taken on ::1: pick another
            kind = PortInUse if exc.errno == errno.EADDRINUSE else ListenError
            raise kind(IPV6_LOOPBACK, bound, purpose, exc) from exc
    raise AssertionError("unreachable")  # the last attempt returns or raises


async def _bind(host: str, port: int, purpose: ListenPurpose) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        kind = PortInUse if exc.errno == errno.EADDRINUSE else ListenError
        raise kind(host, port, purpose, exc) from exc


def close_listeners(listeners: list[trio.SocketListener] | None) -> None:
    """Close listeners that were bound but never served (a start that failed before serving them)."""
    for listener in listeners or ():
        listener.socket.close()
