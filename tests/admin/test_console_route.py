"""The console's static files and the guard's public paths (no processes, no browser)."""

from __future__ import annotations

import pytest

from hydra_node.admin.assets import CONSOLE_PREFIX, MAX_CONSOLE_BYTES, PUBLIC_PATHS, ConsoleAssets, _asset, load_assets
from hydra_node.http.guard import GuardSettings, screen
from hydra_node.http.messages import Request, Response
from hydra_node.admin.management import ManagementApi

EXPECTED = {
    "index.html",
    "app.js",
    "api.js",
    "live.js",
    "dom.js",
    "chart.js",
    "style.css",
    *(f"pages/{p}.js" for p in ("overview", "mesh", "models", "routing", "chat", "events")),
}


def test_every_console_file_is_package_data_within_the_size_bound():
    assets = load_assets()
    assert EXPECTED <= set(assets)
    total = sum(len(a.body) for a in assets.values())
    assert total <= MAX_CONSOLE_BYTES == 200 * 1024
    assert b"/console/app.js" in assets["index.html"].body
    for name, a in assets.items():  # no CDN, no inline script: the CSP allows only this origin
        assert b"http://" not in a.body.replace(b"http://www.w3.org/2000/svg", b"") and b"https://" not in a.body, name


def test_an_oversized_or_untyped_console_is_refused():
    with pytest.raises(ValueError, match="content type"):
        _asset("notes.txt", b"x")
    with pytest.raises(ValueError, match="no index.html"):
        load_assets("hydra_node.admin", "console/pages")


@pytest.mark.parametrize(
    "path, kind",
    [
        ("/", "text/html"),
        ("/dashboard", "text/html"),
        ("/dashboard/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/pages/mesh.js", "text/javascript"),
        ("/console/style.css", "text/css"),
    ],
)
def test_files_have_their_content_type_validators_and_policy(path, kind):
    console = ConsoleAssets()
    r = console.respond("GET", path, {})
    assert r.status == 200 and r.content_type.startswith(kind) and r.body
    headers = dict(r.headers)
    assert headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    again = console.respond("GET", path, {"if-none-match": f'"other", {headers["etag"]}'})
    assert again.status == 304 and again.body == b""


def test_other_paths_methods_and_headless():
    console = ConsoleAssets()
    assert console.respond("GET", "/api/status", {}) is None
    assert console.respond("GET", "/console/nope.js", {}).status == 404
    assert console.respond("GET", "/console/../node.py", {}).status == 404
    assert console.respond("POST", "/", {}).status == 405
    headless = ConsoleAssets(headless=True)
    assert headless.assets == {}
    for path in ("/", "/dashboard", "/console/app.js"):
        assert headless.respond("GET", path, {}).status == 404


def test_the_guard_lets_only_console_gets_through_without_the_key():
    g = GuardSettings(csrf=True, api_key="k", public_paths=PUBLIC_PATHS)
    host = {"host": "127.0.0.1:3131"}
    for path in ("/", "/dashboard", CONSOLE_PREFIX + "app.js", CONSOLE_PREFIX + "pages/chat.js"):
        assert screen("GET", path, host, g) is None, path
    for method, path in (
        ("GET", "/api/status"),
        ("GET", "/api/events"),
        ("GET", "/v1/models"),
        ("GET", "/consolex"),
        ("POST", "/"),
        ("DELETE", "/console/app.js"),
    ):
        v = screen(method, path, {**host, "content-type": "application/json"}, g)
        assert v is not None and v.status == 401, (method, path)
    assert screen("GET", "/api/status", {**host, "authorization": "Bearer k"}, g) is None
    assert screen("GET", "/", {"host": "evil.example"}, g).status == 403  # DNS rebinding rules still apply


def _request(method, path, headers=None):
    return Request(method, path, {}, headers or {}, b"")


async def test_management_serves_the_console_before_its_key_check_and_the_api_after_it():
    async def route(request):
        raise AssertionError("no route should run")

    api = ManagementApi(health=lambda: (200, {}), status=lambda: {"ok": True}, routes={}, headless=False, api_key="k")
    page = await api.handle(_request("GET", "/"))
    assert page.status == 200 and page.content_type.startswith("text/html")
    assert (await api.handle(_request("GET", "/api/status"))).status == 401
    assert (await api.handle(_request("GET", "/api/status", {"authorization": "Bearer k"}))).status == 200
    off = ManagementApi(health=lambda: (200, {}), status=lambda: {}, routes={}, headless=True)
    assert (await off.handle(_request("GET", "/"))).status == 404
    assert (await off.handle(_request("GET", "/api/status"))).status == 200


async def test_v1_on_the_management_port_goes_to_the_openai_handler_after_the_key_check():
    seen = []

    async def openai(request):
        seen.append(request.path)
        return Response.json(200, {"object": "list", "data": []})

    api = ManagementApi(
        health=lambda: (200, {}), status=lambda: {}, routes={}, headless=False, api_key="k", openai=openai
    )
    assert (await api.handle(_request("GET", "/v1/models"))).status == 401 and seen == []
    r = await api.handle(_request("POST", "/v1/chat/completions", {"authorization": "Bearer k"}))
    assert r.status == 200 and seen == ["/v1/chat/completions"]
    assert api.public_paths == PUBLIC_PATHS
    assert (await api.handle(_request("GET", "/v1x", {"authorization": "Bearer k"}))).status == 404
