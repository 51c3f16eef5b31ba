"""Console first render: the web console vs the bare /api/status fetch, idle and under load.

One node (bundled model) and headless Chromium (Debian's ``chromium``, driven over CDP by
``tests/admin/cdp.py``).  Each round loads, interleaved, in fresh pages: (a) the console's
overview, timed from navigation start to its first render with the node's status (the
``hydra-first-render`` mark), and (b) a blank page of the same origin that only fetches
/api/status (the floor any page pays to show data); then both again while 4 chat streams run on
the node.  Prints medians and p95, the console/floor ratios, loaded/idle ratios, the 300 ms goal
of issue 17, and the console's payload.

Run: .venv/bin/python bench/console.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

import trio

from _common import NodeProcess, median, percentile, stream_chat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "admin"))
from cdp import find_chromium, open_browser  # noqa: E402
from hydra_node.models import BUNDLED_MODEL_ID  # noqa: E402

GOAL_MS = 300.0
FLOOR_JS = """(async () => { await (await fetch('/api/status')).json();
  return performance.now(); })()"""


async def console_ms(browser, port: int) -> float:
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{port}/#overview")
    await page.wait_for("document.body.dataset.ready === '1'", what="first render")
    ms = await page.evaluate("performance.getEntriesByName('hydra-first-render')[0].startTime")
    await page.close()
    return ms


async def floor_ms(browser, port: int) -> float:
    page = await browser.new_page()
    await page.goto(f"http://127.0.0.1:{port}/health")  # same origin, a tiny document
    ms = await page.evaluate(FLOOR_JS)
    await page.close()
    return ms


def load(port: int, stop: threading.Event) -> None:
    body = {
        "model": BUNDLED_MODEL_ID,
        "messages": [{"role": "user", "content": "Count to fifty."}],
        "max_tokens": 64,
        "temperature": 0,
    }
    while not stop.is_set():
        try:
            stream_chat(port, body, timeout_s=300)
        except (OSError, TimeoutError) as exc:  # a slow machine: keep loading, say so
            print(f"load stream: {exc}", file=sys.stderr)


async def run(rounds: int, chromium: str, node: NodeProcess) -> dict:
    out = {k: [] for k in ("console_idle", "floor_idle", "console_load", "floor_load")}
    port = node.console_port
    async with open_browser(chromium) as browser:
        await console_ms(browser, port)  # warm the browser once
        for loaded in (False, True):
            stop = threading.Event()
            threads = [
                threading.Thread(target=load, args=(node.api_port, stop), daemon=True)
                for _ in range(4 if loaded else 0)
            ]
            for t in threads:
                t.start()
            if loaded:
                await trio.sleep(2)
            tag = "load" if loaded else "idle"
            for i in range(rounds):
                pair = [("console", console_ms), ("floor", floor_ms)]
                for name, fn in pair if i % 2 == 0 else pair[::-1]:
                    out[f"{name}_{tag}"].append(await fn(browser, port))
            stop.set()
            for t in threads:
                t.join(timeout=150)
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{port}/#overview")
        await page.wait_for("document.body.dataset.ready === '1'")
        out[
            "payload"
        ] = await page.evaluate("""[performance.getEntriesByType('navigation')[0], ...performance.getEntriesByType('resource')]
          .filter((e) => new URL(e.name).pathname === '/' || new URL(e.name).pathname.startsWith('/console/'))
          .reduce((a, e) => a + e.decodedBodySize, 0)""")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    chromium = find_chromium()
    if not chromium:
        sys.exit("chromium is not installed: apt-get install chromium")
    node = NodeProcess(Path(tempfile.mkdtemp(prefix="hydra-bench-console-")), "--name", "bench").start()
    try:
        r = trio.run(run, args.rounds, chromium, node)
    finally:
        node.kill_all()
    row = lambda k: f"median {median(r[k]):7.1f} ms  p95 {percentile(r[k], 95):7.1f} ms"  # noqa: E731
    print(f"first render with data, {args.rounds} fresh pages each (ms from navigation start)")
    for k in ("console_idle", "floor_idle", "console_load", "floor_load"):
        print(f"  {k:<13} {row(k)}")
    print(
        f"console / floor: idle x{median(r['console_idle']) / median(r['floor_idle']):.2f}, "
        f"loaded x{median(r['console_load']) / median(r['floor_load']):.2f}"
    )
    print(
        f"loaded / idle: console x{median(r['console_load']) / median(r['console_idle']):.2f}, "
        f"floor x{median(r['floor_load']) / median(r['floor_idle']):.2f}"
    )
    print(
        f"goal < {GOAL_MS:.0f} ms: idle median {'met' if median(r['console_idle']) < GOAL_MS else 'NOT met'}, "
        f"loaded median {'met' if median(r['console_load']) < GOAL_MS else 'NOT met'}"
    )
    print(f"payload: {r['payload']} bytes uncompressed (goal <= {200 * 1024})")
    print(json.dumps({k: [round(x, 1) for x in v] for k, v in r.items() if isinstance(v, list)}))


if __name__ == "__main__":
    main()
