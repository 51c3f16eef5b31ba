"""Hypothesis fuzz of the management API's JSON bodies against a real node (issue 14 item 10): every
answer is a typed JSON error or success (never a 500), the node keeps answering /health, and its
memory stays within a bound of its baseline. Bounded: one node without a model, ~150 requests."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import NodeProcess, request
from hydra_node.models import BUNDLED_MODEL_ID

pytestmark = pytest.mark.live

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20,
)
#: never a reference that names a loadable model (the fuzz must not load one)
model_refs = st.text(max_size=40).filter(lambda s: s not in ("default", "bundled", BUNDLED_MODEL_ID))
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"model": model_refs}, optional={"split": json_values, "wait": json_values, "timeout_s": json_values}
    ),
    st.fixed_dictionaries({"ttl_s": json_values}),
    st.fixed_dictionaries({"ttl_s": st.just(600), "uses": json_values}),
    st.fixed_dictionaries({"token": json_values}),
    st.binary(max_size=60),  # not JSON at all (and not UTF-8)
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),  # nesting past every bound
)
ROUTES = [
    ("POST", "/api/runtime/models"),
    ("POST", "/api/invite"),
    ("DELETE", "/api/runtime/models/{}"),
    ("GET", "/api/runtime/models"),
    ("GET", "/api/status"),
    ("POST", "/api/invite/revoke"),
    ("GET", "/api/invites"),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(tmp_path_factory.mktemp("fuzz-mgmt"), "--no-model").start()
    yield n
    n.kill_all()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(route=st.sampled_from(ROUTES), body=bodies, suffix=st.text(max_size=20))
def test_management_bodies_get_typed_answers_and_the_node_stays_up(node, route, body, suffix):
    method, path = route
    if "{}" in path:
        path = path.format(urllib.parse.quote(suffix or "x", safe=""))
    raw = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    code, text = request(method, node.console_port, path, raw, timeout=30)
    assert code < 500 or code == 503, (code, text)
    answer = json.loads(text)
    if code >= 400:
        assert set(answer["error"]) >= {"message", "type", "code"}


def test_after_the_fuzz_the_node_answers_and_its_memory_is_bounded(node):
    base = _rss_kib(node.proc.pid)
    deep, big = b"[" * 2000 + b"]" * 2000, b"[" * 100_000 + b"]" * 100_000  # within the route's 4 KiB bound, past it
    for _ in range(20):
        assert request("POST", node.console_port, "/api/runtime/models", deep)[0] == 400  # invalid_json
        assert request("POST", node.console_port, "/api/runtime/models", big)[0] == 413  # body_too_large
    assert request("GET", node.console_port, "/health")[0] == 200
    assert _rss_kib(node.proc.pid) < base + 64 * 1024  # within 64 MiB of where it was
