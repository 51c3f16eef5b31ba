"""How this node takes part in relaying (``--relay``, ``--relay-rate``): settings loaded once."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra_node.mesh.relay.limits import RelayLimits

__all__ = ["RELAY_MODES", "RelaySettings"]

RELAY_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class RelaySettings:
    """``mode``: relay for others — ``auto`` when we can be dialled and are not a client, ``on``
    whenever we are not known to be unreachable, ``off`` never. ``use_relays``: when we cannot be
    dialled, reserve at relays and announce them. ``hole_punch``: move relayed links to a direct
    path (dial the peer if it can be dialled, else TCP hole punching) and answer peers' punches.
    ``limits``: what we allow when relaying."""

    mode: str = "auto"
    use_relays: bool = True
    hole_punch: bool = True
    limits: RelayLimits = field(default_factory=RelayLimits)

    def __post_init__(self) -> None:
        if self.mode not in RELAY_MODES:
            raise ValueError(f"relay mode must be one of {', '.join(RELAY_MODES)}, not {self.mode!r}")
