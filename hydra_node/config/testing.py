"""``[testing]``: fault injection on this node's mesh links, for tests and benchmarks only.

Every mesh link this node opens or accepts applies it on its send path
(:class:`hydra_node.mesh.link.faults.FaultInjection`): a delay line (``link_latency_ms`` plus
up to ``link_jitter_ms``, order kept, like netem delay), lost priority-lane messages
(``link_message_loss``: gossip) and lost encrypted frames (``link_frame_loss``: the peer sees a
gap and closes the link). Set on both ends of a link, the latency counts twice in its RTT. A node
with any of them set logs one WARNING at start (``event=link_fault_injection``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hydra_node.config.defaults import _check

if TYPE_CHECKING:  # the config loader stays importable without the mesh
    from hydra_node.mesh.link.faults import FaultInjection

__all__ = ["MAX_LINK_DELAY_MS", "LinkFaultsSection"]

#: Upper bound on ``[testing].link_latency_ms`` and ``link_jitter_ms`` (a minute per frame).
MAX_LINK_DELAY_MS = 60_000.0


@dataclass(frozen=True)
class LinkFaultsSection:
    """``[testing]``: what every mesh link of this node injects on its send path (docs/config.md)."""

    link_latency_ms: float = 0.0  # added to every frame sent (one way)
    link_jitter_ms: float = 0.0  # plus a uniform 0 .. this much more per frame
    link_message_loss: float = 0.0  # probability a priority-lane message (gossip) is dropped
    link_frame_loss: float = 0.0  # probability an encrypted frame is dropped (the peer closes the link)

    def validate(self, prefix: str) -> None:
        for name in ("link_latency_ms", "link_jitter_ms"):
            value = getattr(self, name)
            _check(
                0.0 <= value <= MAX_LINK_DELAY_MS,
                f"[{prefix}].{name}",
                f"must be between 0 and {MAX_LINK_DELAY_MS:g} milliseconds, not {value}",
            )
        for name in ("link_message_loss", "link_frame_loss"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, f"[{prefix}].{name}", f"must be a probability between 0 and 1, not {value}")

    @property
    def active(self) -> bool:
        return any((self.link_latency_ms, self.link_jitter_ms, self.link_message_loss, self.link_frame_loss))

    def link_faults(self) -> FaultInjection | None:
        """The links' :class:`FaultInjection`, or None when nothing is injected (the default)."""
        if not self.active:
            return None
        from hydra_node.mesh.link.faults import FaultInjection

        return FaultInjection(
            latency_s=self.link_latency_ms / 1000.0,
            jitter_s=self.link_jitter_ms / 1000.0,
            message_loss=self.link_message_loss,
            frame_loss=self.link_frame_loss,
        )
