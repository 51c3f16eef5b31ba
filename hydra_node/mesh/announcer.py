"""Our announcement: what the root says about this node, stamped with who and where we are.

The composition root supplies an :data:`AnnouncementSource` (a callable returning
:class:`AnnouncementContent`: models, hardware, load, RPC capacity, ``extra`` entries such as the
telemetry summary); the mesh never asks the node. :class:`Announcer` adds our identity, role and
link addresses, and tells whether the result changed since it was last published — a changed
announcement is gossiped (the membership core stamps incarnation and seq, then re-signs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from hydra_node.mesh.membership import Announcement, Hardware, ModelEntry, RpcCapacity

__all__ = ["ANNOUNCE_CHECK_S", "AnnouncementContent", "AnnouncementSource", "Announcer"]

#: How often our announcement is re-checked for changes (queue depth, model states).
ANNOUNCE_CHECK_S = 0.5


@dataclass(frozen=True)
class AnnouncementContent:
    """What this node offers right now. ``extra`` must keep its value until it really changed:
    a changed ``extra`` is a new announcement."""

    models: tuple[ModelEntry, ...] = ()
    hardware: Hardware = Hardware()
    queue_depth: int = 0
    throughput_milli: tuple[tuple[str, int], ...] = ()
    api_port: int | None = None
    console_port: int | None = None
    rpc: RpcCapacity | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)


AnnouncementSource = Callable[[], AnnouncementContent]


class Announcer:
    """Builds our announcement from the root's content; ``name`` goes into ``extra["name"]``."""

    def __init__(self, node_id: str, *, role: str, name: str, version: str, source: AnnouncementSource) -> None:
        self.node_id = node_id
        self.role = role
        self.name = name
        self.version = version
        self._source = source
        self._published: tuple | None = None

    def build(self, *, incarnation: int, addresses: tuple[str, ...]) -> Announcement:
        c = self._source()
        return Announcement(
            node_id=self.node_id,
            incarnation=incarnation,
            version=self.version,
            role=self.role,
            addresses=addresses,
            api_port=c.api_port,
            console_port=c.console_port,
            models=c.models,
            hardware=c.hardware,
            queue_depth=c.queue_depth,
            throughput_milli=c.throughput_milli,
            rpc=c.rpc,
            extra={**c.extra, "name": self.name},
        )

    def changed(self, ann: Announcement) -> bool:
        """True (and remembered as published) when ``ann`` differs from the last published one
        in what peers act on. Hardware is left out: free memory moves all the time, and a fresh value
        rides along with the next real change."""
        key = (
            ann.models,
            ann.queue_depth,
            ann.api_port,
            ann.console_port,
            ann.addresses,
            ann.throughput_milli,
            ann.incarnation,
            dict(ann.extra),
            ann.rpc,
        )
        if key == self._published:
            return False
        self._published = key
        return True
