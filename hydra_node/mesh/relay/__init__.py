"""Reaching peers that cannot be dialled: reachability by dial-back, relays, relayed links.

``messages`` (the wire, sans-IO), ``limits`` (reservations, circuits, token bucket; sans-IO),
``reachability`` (the verdict; sans-IO), ``selection`` (pure policy), ``transport`` (a link's
transport over a relayed stream), ``server`` (relaying for others), ``client`` (reserving,
dialling and accepting through a relay), ``agent`` (the trio driver the mesh service runs).
Moving relayed links to a direct path: ``punch`` (hole-punch messages and rules; sans-IO),
``upgrade_plan`` (attempts and back-off; sans-IO), ``simopen`` (TCP simultaneous open and the
punched link), ``upgrade`` (the trio driver).
Protocol: protocol/README.md "Relays"; guide: docs/relays.md.
"""

from hydra_node.mesh.relay.settings import RELAY_MODES, RelaySettings
from hydra_node.mesh.relay.limits import RelayLimits

__all__ = ["RELAY_MODES", "RelayLimits", "RelaySettings"]
