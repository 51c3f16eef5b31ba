"""The mesh service's settings (loaded once by the config loader, never changed afterwards)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra_node.mesh.link.faults import FaultInjection
from hydra_node.mesh.membership import MembershipConfig
from hydra_node.mesh.relay.settings import RelaySettings

__all__ = ["MeshSettings"]


@dataclass(frozen=True)
class MeshSettings:
    """``join``: invite tokens from ``--join`` (the root turns them into the first JoinPlan);
    ``join_timeout_s`` bounds being admitted by an invite; ``role`` is host | worker | client."""

    listen_host: str = "0.0.0.0"
    listen_port: int = 9338
    advertise: tuple[str, ...] = ()
    join: tuple[str, ...] = ()
    role: str = "host"
    join_timeout_s: float = 30.0
    invite_ttl_s: float = 24 * 3600.0
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    fault: FaultInjection | None = None
    relay: RelaySettings = field(default_factory=RelaySettings)
