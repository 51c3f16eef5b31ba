"""This machine's IPv4 addresses, to advertise in invites and announcements."""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915


def local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of the up interfaces, then 127.0.0.1 last."""
    out: list[str] = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            addr = socket.inet_ntoa(packed[20:24])
            if not addr.startswith("127.") and addr not in out:
                out.append(addr)
    out.append("127.0.0.1")
    return out


def advertised_addresses(listen_host: str, port: int, explicit: tuple[str, ...] = ()) -> list[str]:
    """``host:port`` strings peers should dial: explicit ones, else derived from the listen host."""
    if explicit:
        return [a if ":" in a else f"{a}:{port}" for a in explicit]
    if listen_host in ("0.0.0.0", ""):
        return [f"{a}:{port}" for a in local_ipv4_addresses()]
    return [f"{listen_host}:{port}"]
