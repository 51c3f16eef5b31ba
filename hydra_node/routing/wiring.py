"""Plugs the live scheduler into a node: status sections, ``/metrics``, the announcement summary.

Kept out of node.py so the node only creates the router with a ``LiveScheduling``, calls
``wire_scheduling(node)`` and starts ``LiveScheduling.run`` once the mesh is up.
"""

from __future__ import annotations

from hydra_node.metrics import NodeMetrics
from hydra_node.routing.live import LiveScheduling


def wire_scheduling(node) -> NodeMetrics:
    """Register ``network_costs`` and ``scheduler`` in /api/status, GET /metrics, and the gossip summary."""
    live: LiveScheduling = node.router.scheduling
    metrics = NodeMetrics(node)
    live.listeners.append(metrics.observe)
    node.add_status_section("network_costs", live.network_costs)
    node.add_status_section("scheduler", live.status)
    node.management_routes()[("GET", "/metrics")] = metrics.handle
    if node.mesh is not None:
        node.mesh.extra_sources.append(live.announce_extra)
    return metrics
