"""``/metrics`` exports the router's statistics (docs/scheduler.md, the metrics table): retries,
requests with no target, and mid-stream continuations and the failures not continued."""

from __future__ import annotations

from hydra_node.admin.metrics import MetricsSources, NodeMetrics
from hydra_node.routing.router import RouterStatistics


def render(stats: RouterStatistics) -> str:
    return NodeMetrics(MetricsSources(http_requests=dict, runners=list, routing=lambda: stats)).render().decode()


def test_the_router_counters_are_exported_as_prometheus_counters():
    text = render(RouterStatistics(retries=4, no_target=1, continuations=3, continuation_failures=2))
    assert "hydra_route_retries_total 4.0" in text
    assert "hydra_route_no_target_total 1.0" in text
    assert "hydra_route_continuations_total 3.0" in text
    assert "hydra_route_continuation_failures_total 2.0" in text
    assert "# TYPE hydra_route_continuations_total counter" in text
    assert "# TYPE hydra_route_continuation_failures_total counter" in text
