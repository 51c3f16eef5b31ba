"""Binding a node's TCP listeners, with an error that says which port, what for, and how to change it.

The node binds every listener it opens at start (the OpenAI API, the management API, the peer
links, the tunnel data port) before it loads models or joins a mesh, and serves them later: a
port held by another program then stops the start at once, with one line naming the port and
the option that moves it, instead of an ``[Errno 98]`` after the node already joined.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import trio

__all__ = ["ListenError", "ListenPurpose", "PortInUse", "bind_tcp", "close_listeners"]


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


async def bind_tcp(host: str, port: int, purpose: ListenPurpose) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners(port, host=host)``, raising :class:`PortInUse` / :class:`ListenError`
    instead of a bare OSError.  The listeners are not served yet: hand them to ``trio.serve_listeners``."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        kind = PortInUse if exc.errno == errno.EADDRINUSE else ListenError
        raise kind(host, port, purpose, exc) from exc


def close_listeners(listeners: list[trio.SocketListener] | None) -> None:
    """Close listeners that were bound but never served (a start that failed before serving them)."""
    for listener in listeners or ():
        listener.socket.close()
