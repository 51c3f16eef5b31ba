"""One authenticated, encrypted link to a peer (`peer_link.PeerLink`), its streams (`stream`),
pings and RTT (`pings`), the listener and dialler (`endpoints`), and test fault injection
(`faults`). The bytes it speaks are in `hydra_node.mesh.wire`."""

from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.link.settings import LinkSettings
from hydra_node.mesh.link.stream import LinkStream

__all__ = ["LinkSettings", "LinkStream", "PeerLink"]
