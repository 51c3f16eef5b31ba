"""The console with --listen-all --api-key (the key entered once, kept for the tab, sent as Bearer)
and with --headless (404), against real nodes."""

from __future__ import annotations

import json

from cdp import open_browser
from harness import NodeProcess, request

KEY = "console-test-key-0123456789"


async def test_the_api_key_is_asked_once_kept_for_the_tab_and_sent_as_bearer(tmp_path, chromium, screenshots):
    node = NodeProcess(tmp_path / "keyed", "--name", "keyed", "--no-model", "--listen-all", "--api-key", KEY).start()
    try:
        port = node.console_port
        assert request("GET", port, "/api/status")[0] == 401
        code, page_html = request("GET", port, "/")  # the page itself is no secret
        assert code == 200 and "/console/app.js" in page_html
        async with open_browser(chromium) as browser:
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{port}/#overview")
            await page.wait_for("document.getElementById('key-dialog').open", what="the key prompt")
            await page.screenshot(screenshots / "desktop-api-key.png")
            await page.type_into("#key-input", "wrong-key")
            await page.evaluate("document.getElementById('key-form').requestSubmit()")
            reason = await page.wait_for(
                "document.getElementById('key-dialog').open && document.getElementById('key-reason').textContent",
                what="the prompt again after a wrong key",
            )
            assert "refused" in reason
            await page.type_into("#key-input", KEY)
            await page.evaluate("document.getElementById('key-form').requestSubmit()")
            await page.wait_for("document.body.dataset.ready === '1'", what="the overview with the key")
            node_id = await page.evaluate("document.querySelector('.facts dd code').textContent")
            code, body = request("GET", port, "/api/status", headers={"Authorization": f"Bearer {KEY}"})
            assert code == 200 and node_id == json.loads(body)["node_id"]
            assert await page.evaluate("sessionStorage.getItem('hydra.apiKey')") == KEY
            await page.wait_for("hydraLive.stream === 'live'", what="the event stream read with the key")
            # a reload keeps the key for the tab: no prompt
            await page.goto(f"http://127.0.0.1:{port}/#mesh")
            await page.wait_for("document.body.dataset.ready === '1'", what="the mesh page after a reload")
            assert not await page.evaluate("document.getElementById('key-dialog').open")
            # "Forget key" drops it from the tab and asks again
            await page.click("#forget-key")
            await page.wait_for(
                "document.getElementById('key-dialog').open", what="the prompt after forgetting the key"
            )
            assert await page.evaluate("sessionStorage.getItem('hydra.apiKey')") is None
            # the only errors are the refused requests themselves (401s), nothing thrown
            assert [e for e in page.errors if "401" not in e] == []
    finally:
        node.kill_all()


def test_headless_has_no_console_but_keeps_the_api(tmp_path):
    node = NodeProcess(tmp_path / "headless", "--no-model", "--headless").start()
    try:
        for path in ("/", "/dashboard", "/console/app.js", "/console/style.css"):
            code, body = request("GET", node.console_port, path)
            assert code == 404 and json.loads(body)["error"]["code"] == "not_found", path
        assert request("GET", node.console_port, "/api/status")[0] == 200
    finally:
        node.kill_all()
