"""The web console in headless Chromium against a live 3-node loopback mesh.

alpha hosts the bundled model; beta and gamma host nothing (beta loads it from its console page;
gamma is killed with kill -9 at the end).  Every page is rendered at a laptop and a phone width,
with screenshots under build/screenshots/."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import trio

from cdp import open_browser
from harness import NodeProcess, request
from hydra_node.admin.assets import MAX_CONSOLE_BYTES
from hydra_node.mesh.wire.token import parse_invite
from hydra_node.models import BUNDLED_MODEL_ID
from pagekit import (
    PAGES,
    VIEWPORTS,
    contrast_failures,
    first_render,
    open_console,
    overflow,
    payload_bytes,
    show,
    tab_order,
)

#: The membership defaults promise a kill -9 is noticed by every peer within this bound on a LAN
#: (tests/mesh/test_mesh_live.py); the page shows it after the next event or status read.
DETECTION_BOUND_S = 10.0
PAGE_SLACK_S = 5.0


def _alive(st) -> set[str]:
    return {p["id"] for p in st["peers"] if p["state"] == "alive"}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    a = NodeProcess(root / "alpha", "--name", "alpha").start()
    token = a.invite()
    b = NodeProcess(root / "beta", "--name", "beta", "--no-model", "--join", token).start(wait=False)
    c = NodeProcess(root / "gamma", "--name", "gamma", "--no-model", "--join", token).start(wait=False)
    nodes = {"alpha": a, "beta": b, "gamma": c}
    try:
        b.wait_ready()
        c.wait_ready()
        ids = {n: p.status()["node_id"] for n, p in nodes.items()}
        for n, p in nodes.items():
            others = {ids[m] for m in nodes if m != n}
            p.wait_status(lambda st, others=others: _alive(st) >= others, timeout=30, what=f"{n} sees everyone")
        yield {**nodes, "ids": ids}
    finally:
        for p in nodes.values():
            p.kill_all()


async def test_keyboard_reaches_every_page(mesh, chromium):
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port)
        order = await tab_order(page, 10)
        assert order[0] == "#main"  # the skip link comes first
        assert [f"#{p}" for p in PAGES] == [x for x in order if x.lstrip("#") in PAGES]
        await page.evaluate("document.querySelector('nav a[href=\"#mesh\"]').focus()")
        await page.press("Enter", "Enter", 13)
        await page.wait_for("location.hash === '#mesh' && !!document.getElementById('page-mesh')", what="the mesh page")
        assert page.errors == []


async def test_the_invite_button_mints_a_token_of_this_mesh(mesh, chromium):
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port)
        await page.click("#invite-btn")
        token = await page.wait_for("(document.getElementById('invite-token') || {}).value", what="the minted token")
        assert parse_invite(token, time.time()).mesh_id == mesh["alpha"].status()["mesh"]["mesh_id"]
        assert page.errors == []


async def test_the_events_page_lists_and_filters_the_stream(mesh, chromium):
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port, "events")
        await page.wait_for(
            "document.querySelectorAll('#event-list li[data-type=\"peer.joined\"]').length >= 2",
            what="the replayed peer.joined events",
        )
        await page.click("input[data-group=peer]")
        await page.wait_for(
            "![...document.querySelectorAll('#event-list li[data-type]')].some((li) => li.dataset.type.startsWith('peer.'))",
            what="peer events filtered out",
        )
        await page.click("input[data-group=peer]")
        await page.type_into("#event-filter", "gamma")
        names = await page.wait_for(
            "(() => { const t = [...document.querySelectorAll('#event-list li[data-type]')].map((li) => li.textContent);"
            " return t.length && t; })()",
            what="events about gamma",
        )
        assert all("gamma" in t for t in names)
        assert page.errors == []


async def test_the_topology_shows_all_three_nodes_and_peers_by_name(mesh, chromium):
    ids = mesh["ids"]
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port, "mesh")
        shown = await page.wait_for(
            "(() => { const g = [...document.querySelectorAll('svg.topology g.peer[data-id]')].map((e) => e.dataset.id);"
            " return g.length === 2 ? g : null; })()",
            what="two peers in the graph",
        )
        assert set(shown) == {ids["beta"], ids["gamma"]}
        assert await page.evaluate("!!document.querySelector('svg.topology g.self')")
        rows = await page.wait_for(
            "(() => { const r = [...document.querySelectorAll('tr[data-peer]')].map((e) => [e.dataset.peer, e.dataset.state, e.cells[0].textContent]);"
            " return r.every((x) => x[2] === 'beta' || x[2] === 'gamma') && r.length === 2 ? r : null; })()",
            what="both peers in the table, by name",
        )
        assert {r[0]: r[1] for r in rows} == {ids["beta"]: "alive", ids["gamma"]: "alive"}
        await page.type_into("#peer-search", "gamm")
        await page.wait_for("document.querySelectorAll('tr[data-peer]').length === 1", what="the filter")
        assert page.errors == []


async def test_a_chat_streams_tokens_into_the_page(mesh, chromium):
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port, "chat")
        await page.wait_for(
            f"[...document.querySelectorAll('#chat-model option')].some((o) => o.value === '{BUNDLED_MODEL_ID}')",
            what="the model list",
        )
        offered = await page.evaluate("[...document.querySelectorAll('#chat-model option')].map((o) => o.value)")
        code, body = request("GET", mesh["alpha"].api_port, "/v1/models")
        assert code == 200 and set(offered) == {m["id"] for m in json.loads(body)["data"]}  # `mesh` too where listed
        await page.evaluate(f"document.getElementById('chat-model').value = '{BUNDLED_MODEL_ID}'")
        await page.evaluate(
            "document.getElementById('chat-temp').value = '0'; document.getElementById('chat-max').value = '24'"
        )
        # watch the answer grow: streaming means the text is seen at more than one length
        await page.evaluate("""window.lengths = []; new MutationObserver(() => { const t = document.querySelector('.msg.assistant .text');
          if (t) window.lengths.push(t.textContent.length); }).observe(document.getElementById('chat-log'), {subtree: true, childList: true, characterData: true})""")
        await page.type_into("#chat-input", "Name three colours.")
        await page.click("#chat-send")
        stats = await page.wait_for(
            "document.getElementById('chat-stats').dataset.ttft !== undefined && document.getElementById('chat-send').disabled === false"
            " && document.getElementById('chat-stats').textContent",
            timeout=60,
            what="the answer's figures",
        )
        assert "TTFT" in stats and "tok/s" in stats, stats
        text = await page.evaluate("document.querySelector('.msg.assistant .text').textContent")
        assert text.strip()
        lengths = await page.evaluate("[...new Set(window.lengths)].filter((n) => n > 0)")
        assert len(lengths) > 1, f"the answer arrived in one piece: {lengths}"
        # the request's routing decision, with its score breakdown, on the routing page
        await show(page, "routing")
        await page.wait_for("document.querySelector('#decisions details summary')", what="a routing decision")
        await page.click("#decisions details summary")
        headers = await page.wait_for(
            "[...document.querySelectorAll('#decisions details[open] th')].map((th) => th.textContent)",
            what="the score breakdown",
        )
        assert "Score ms" in headers and "queue" in headers
        assert page.errors == []


async def test_a_model_loaded_from_the_page_appears_on_the_other_nodes(mesh, chromium):
    beta, ids = mesh["beta"], mesh["ids"]
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, beta.console_port, "models")
        await page.type_into("#load-model", BUNDLED_MODEL_ID)
        await page.click("#load-btn")
        await page.wait_for("document.getElementById('confirm-dialog').open", what="the confirmation")
        await page.click("#confirm-ok")
        await page.wait_for(
            f"document.querySelector('tr[data-local-model=\"{BUNDLED_MODEL_ID}\"][data-state=\"ready\"]')",
            timeout=90,
            what="the model ready on beta's page",
        )
        for other in ("alpha", "gamma"):
            mesh[other].wait_status(
                lambda st: any(
                    p["id"] == ids["beta"] and p["model_states"].get(BUNDLED_MODEL_ID) == "ready" for p in st["peers"]
                ),
                timeout=30,
                what=f"{other} sees beta's model",
            )
        # and alpha's page lists beta as a host
        page2 = await browser.new_page()
        await open_console(page2, mesh["alpha"].console_port, "models")
        await page2.wait_for(
            f"[...document.querySelectorAll('tr[data-model=\"{BUNDLED_MODEL_ID}\"] li')].some((li) => li.textContent.startsWith('beta'))",
            what="beta as a host on alpha's page",
        )
        assert page.errors == [] and page2.errors == []


async def test_every_page_renders_cleanly_at_both_widths(mesh, chromium, screenshots):
    port = mesh["alpha"].console_port
    timings = {}
    async with open_browser(chromium) as browser:
        for vp, width, height, mobile in VIEWPORTS:
            page = await browser.new_page(width, height)
            await page.viewport(width, height, mobile)
            await open_console(page, port)
            timings[vp] = await first_render(page)
            sizes = await payload_bytes(page)
            assert sum(sizes.values()) <= MAX_CONSOLE_BYTES, sizes
            for name in PAGES:
                await show(page, name)
                await trio.sleep(0.3)  # let the page's own fetches (models, history) land before looking
                assert await overflow(page) == 0, f"{name} scrolls sideways at {width}px"
                assert await contrast_failures(page) == [], name
                await page.screenshot(screenshots / f"{vp}-{name}.png")
            assert page.errors == [], page.errors
            await page.close()
    (screenshots / "timings.json").write_text(json.dumps(timings, indent=1))
    print("first render (ms from navigation start):", json.dumps(timings))


async def test_the_mesh_page_stays_readable_with_150_peers(mesh, chromium, screenshots):
    """The graph and table with 150 peers (added to the page's own store, as the event stream would):
    every peer drawn, labels give way to tooltips, nothing overflows at either width."""
    async with open_browser(chromium) as browser:
        for vp, width, height, mobile in VIEWPORTS:
            page = await browser.new_page(width, height)
            await page.viewport(width, height, mobile)
            await open_console(page, mesh["alpha"].console_port, "mesh")
            await page.evaluate("""(() => { const states = ['alive', 'alive', 'alive', 'suspect', 'dead', 'left'];
              for (let i = 0; i < 150; i++) { const id = i.toString(16).padStart(8, '0') + 'f'.repeat(56);
                hydraLive.applyEvent({id: 1e12 + i, ts: Date.now() / 1000, type: 'peer.' + (states[i % 6] === 'alive' ? 'joined' : states[i % 6]),
                  node_id: id, name: 'node-' + i}); } })()""")
            count = await page.wait_for(
                "document.querySelectorAll('svg.topology g.peer[data-id]').length >= 152 &&"
                " document.querySelectorAll('svg.topology g.peer[data-id]').length",
                what="152 peers drawn",
            )
            assert count == 152
            assert (
                await page.evaluate("document.querySelectorAll('svg.topology g.peer[data-id] text.label').length") == 0
            )
            assert await page.evaluate("document.querySelectorAll('tr[data-peer]').length") == 152
            assert await overflow(page) == 0
            await page.screenshot(screenshots / f"{vp}-mesh-150-peers.png")
            assert page.errors == []
            await page.close()


async def test_a_peer_killed_with_kill_9_turns_dead_on_the_page(mesh, chromium):
    gamma, ids = mesh["gamma"], mesh["ids"]
    async with open_browser(chromium) as browser:
        page = await browser.new_page()
        await open_console(page, mesh["alpha"].console_port, "mesh")
        await page.wait_for(
            f"document.querySelector('tr[data-peer=\"{ids['gamma']}\"][data-state=\"alive\"]')", what="gamma alive"
        )
        os.killpg(gamma.proc.pid, signal.SIGKILL)
        gamma.proc.wait()
        await page.wait_for(
            f"document.querySelector('tr[data-peer=\"{ids['gamma']}\"][data-state=\"dead\"]')"
            f" && document.querySelector('svg.topology g.peer.st-dead[data-id=\"{ids['gamma']}\"]')",
            timeout=DETECTION_BOUND_S + PAGE_SLACK_S,
            what="gamma dead in the table and the graph",
        )
        assert page.errors == []


def test_the_management_port_passes_v1_through_for_the_chat_page(mesh):
    code, body = request("GET", mesh["alpha"].console_port, "/v1/models")
    assert code == 200 and BUNDLED_MODEL_ID in {m["id"] for m in json.loads(body)["data"]}
