"""The pure front-door decisions (hydra_node/http/guard.py) and limits (hydra_node/http/limits.py)."""

from __future__ import annotations

import pytest

from hydra_node.http.guard import GuardSettings, bearer_matches, normalize_origin, response_headers, screen
from hydra_node.http.limits import ConnectionTable, RateLimitedLog

LOOP = GuardSettings(check_host=True)
MGMT = GuardSettings(check_host=True, csrf=True)
CORS = GuardSettings(check_host=True, cors_origins=("https://app.example",), api_key="k" * 12)


def _h(**kw) -> dict:
    return {k.replace("_", "-"): v for k, v in {"host": "127.0.0.1:9337", **kw}.items()}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:9337", "localhost", "LOCALHOST:1", "[::1]", "[::1]:3131"])
def test_loopback_names_pass_with_or_without_port(host):
    assert screen("GET", "/v1/models", {"host": host}, LOOP) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:9337",
        "127.0.0.1.nip.io",
        "localhost.evil",
        "0.0.0.0:9337",
        "",
        "a b",
        "[::1",
        "127.0.0.1:x",
    ],
)
def test_foreign_hosts_are_403(host):
    v = screen("GET", "/v1/models", {"host": host}, LOOP)
    assert v is not None and (v.status, v.code) == (403, "forbidden_host")
    assert v.error_body()["error"]["type"] == "permission_error"


def test_allow_host_with_and_without_port_and_listen_all():
    s = GuardSettings(check_host=True, allowed_hosts=("proxy.example", "other.example:8080"))
    assert screen("GET", "/", {"host": "proxy.example"}, s) is None
    assert screen("GET", "/", {"host": "Proxy.Example:443"}, s) is None
    assert screen("GET", "/", {"host": "other.example:8080"}, s) is None
    assert screen("GET", "/", {"host": "other.example:8081"}, s).status == 403
    assert screen("GET", "/", {"host": "evil.example"}, GuardSettings(check_host=False)) is None


def test_management_state_changes_need_json_and_a_same_origin():
    ok = _h(content_type="application/json; charset=utf-8")
    assert screen("POST", "/api/invite", ok, MGMT) is None
    assert screen("DELETE", "/api/runtime/models/x", _h(content_type="application/json"), MGMT) is None
    assert screen("GET", "/api/status", _h(), MGMT) is None  # reads need neither
    for ctype in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        headers = _h() if ctype is None else _h(content_type=ctype)
        v = screen("POST", "/api/invite", headers, MGMT)
        assert (v.status, v.code) == (415, "unsupported_media_type")
    same = _h(content_type="application/json", origin="http://127.0.0.1:9337")
    assert screen("POST", "/api/invite", same, MGMT) is None
    for origin in ("http://evil.example", "null", "http://localhost:9337", "http://127.0.0.1:1"):
        v = screen("PUT", "/api/invite", _h(content_type="application/json", origin=origin), MGMT)
        assert (v.status, v.code) == (403, "forbidden_origin"), origin


def test_preflight_is_answered_before_the_key_and_only_for_allowed_origins():
    pre = _h(
        origin="https://app.example",
        access_control_request_method="POST",
        access_control_request_headers="Authorization, Content-Type, X-Stainless-Os",
    )
    v = screen("OPTIONS", "/v1/chat/completions", pre, CORS)
    assert v.status == 204 and not v.refusal
    got = dict(v.headers)
    assert got["access-control-allow-origin"] == "https://app.example" and got["vary"] == "Origin"
    assert "POST" in got["access-control-allow-methods"]
    assert got["access-control-allow-headers"] == "authorization, content-type, x-stainless-os"
    assert int(got["access-control-max-age"]) > 0
    evil = dict(pre, origin="https://evil.example")
    assert screen("OPTIONS", "/v1/chat/completions", evil, CORS).code == "cors_origin_not_allowed"
    # a plain OPTIONS (no preflight headers) is an ordinary request: the key is checked
    assert screen("OPTIONS", "/v1/models", _h(), CORS).status == 401


def test_cors_response_headers_for_allowed_origins_only_and_star():
    assert response_headers(_h(origin="https://app.example"), GuardSettings()) == []
    allowed = dict(response_headers(_h(origin="https://app.example"), CORS))
    assert allowed["access-control-allow-origin"] == "https://app.example" and allowed["vary"] == "Origin"
    assert "access-control-allow-origin" not in dict(response_headers(_h(origin="https://evil.example"), CORS))
    star = GuardSettings(cors_origins=("*",))
    assert dict(response_headers(_h(origin="https://any.example"), star))["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    "auth,ok",
    [
        ("Bearer secret-key", True),
        ("bearer secret-key", True),
        ("BEARER   secret-key ", True),
        ("Bearer wrong-key", False),
        ("Basic secret-key", False),
        ("secret-key", False),
        ("", False),
        (None, False),
        ("Bearer s\u00e9cret-key", False),
        ("Bearer \udcff\udcfe", False),
        ("Bearer \u4e2d\u6587", False),
    ],
)
def test_bearer_scheme_is_case_insensitive_and_any_value_is_a_plain_mismatch(auth, ok):
    assert bearer_matches(auth, "secret-key") is ok
    assert bearer_matches(auth, None) is True


def test_the_key_is_checked_on_the_head_except_for_health():
    s = GuardSettings(api_key="secret-key")
    assert screen("POST", "/v1/completions", _h(), s).status == 401
    assert screen("POST", "/v1/completions", _h(authorization="bearer secret-key"), s) is None
    assert screen("GET", "/health", _h(), s) is None and screen("GET", "/healthz/", _h(), s) is None


@pytest.mark.parametrize(
    "origin,norm",
    [
        ("https://App.Example", "https://app.example"),
        ("http://a.example:8080/", "http://a.example:8080"),
        ("null", None),
        ("file://", None),
        ("http://a.example/path", None),
        ("http://user@a.example", None),
        ("javascript:alert(1)", None),
    ],
)
def test_origin_normalization(origin, norm):
    assert normalize_origin(origin) == norm


def test_connection_table_caps_per_address_and_in_total():
    t = ConnectionTable(max_total=3, max_per_address=2)
    assert t.admit("a") and t.admit("a") and not t.admit("a")
    assert t.admit("b") and not t.admit("c")  # total reached
    t.release("a")
    assert t.count("a") == 1 and t.admit("c")
    for addr in ("a", "b", "c", "zz"):
        t.release(addr)
    assert t.total == 0 and t.count("a") == 0


def test_refusal_log_is_rate_limited_and_counts_what_it_drops():
    rl = RateLimitedLog(per_minute=6, burst=2)
    assert [rl.allow(0.0) for _ in range(5)] == [True, True, False, False, False]
    assert rl.take_suppressed() == 3 and rl.suppressed == 0
    assert rl.allow(10.0)  # one token back after 10 s at 6 a minute
    assert not rl.allow(10.0)


SIMPLE_TYPES = (
    None,
    "text/plain",
    "text/plain; charset=utf-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
)


@pytest.mark.parametrize("ctype", SIMPLE_TYPES)
@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:1"])
def test_a_cors_simple_request_from_a_foreign_origin_is_refused_on_the_api_port(origin, ctype):
    headers = _h(origin=origin) if ctype is None else _h(origin=origin, content_type=ctype)
    for settings in (LOOP, CORS):  # a page could send it without a preflight; the answer it cannot read
        v = screen("POST", "/v1/chat/completions", headers, settings)
        assert v is not None and (v.status, v.code) == (403, "cross_origin_request"), (origin, ctype)
        assert v.error_body()["error"]["type"] == "permission_error"
        assert "application/json" in v.message and "--cors-origin" in v.message and repr(origin) in v.message


def test_cors_simple_requests_stay_open_to_clients_without_origin_and_to_allowed_or_same_origins():
    for ctype in SIMPLE_TYPES:  # no Origin: not a browser page (curl, SDKs), served as before
        headers = _h() if ctype is None else _h(content_type=ctype)
        assert screen("POST", "/v1/chat/completions", headers, LOOP) is None
    text = {"content_type": "text/plain"}
    assert screen("POST", "/v1/completions", _h(origin="http://127.0.0.1:9337", **text), LOOP) is None
    allowed = _h(origin="https://app.example", authorization="Bearer " + "k" * 12, **text)
    assert screen("POST", "/v1/completions", allowed, CORS) is None  # the operator allowed this origin
    star = GuardSettings(cors_origins=("*",))
    assert screen("POST", "/v1/completions", _h(origin="https://any.example", **text), star) is None
    # JSON from a foreign origin: a browser sends it only after a preflight, which it refuses
    json_ = _h(origin="https://evil.example", content_type="application/json")
    assert screen("POST", "/v1/completions", json_, LOOP) is None
    assert screen("GET", "/v1/models", _h(origin="https://evil.example"), LOOP) is None  # reads change nothing


def test_preflight_allows_delete_for_responses():
    """``DELETE /v1/responses/{id}`` from an allowed page: the preflight must list DELETE."""
    pre = _h(origin="https://app.example", access_control_request_method="DELETE")
    v = screen("OPTIONS", "/v1/responses/resp_1", pre, CORS)
    assert v.status == 204
    methods = {m.strip() for m in dict(v.headers)["access-control-allow-methods"].split(",")}
    assert {"GET", "POST", "DELETE", "OPTIONS"} <= methods
