"""What the console browser tests check on every page: no console errors, no horizontal overflow,
readable text contrast, keyboard reachability, payload size and first-render timing."""

from __future__ import annotations

import json

from cdp import Page

__all__ = [
    "PAGES",
    "VIEWPORTS",
    "contrast_failures",
    "first_render",
    "open_console",
    "overflow",
    "payload_bytes",
    "show",
    "tab_order",
]

PAGES = ("overview", "mesh", "models", "routing", "chat", "events")
#: (name, width, height, mobile): a laptop and a phone.
VIEWPORTS = (("desktop", 1280, 800, False), ("phone", 390, 844, True))

# Text elements whose colour against their effective background is below WCAG AA
# (4.5:1, or 3:1 for large text); SVG text is drawn on the page's own fills and is skipped.
_CONTRAST_JS = r"""(() => {
  const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const bgOf = (el) => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c.slice(0, 3); } return [255, 255, 255]; };
  const bad = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg') || !el.offsetParent && el.tagName !== 'BODY') continue;
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const cs = getComputedStyle(el);
    if (el.disabled || cs.visibility === 'hidden' || el.getAttribute('aria-hidden') === 'true') continue;
    const fg = rgb(cs.color).slice(0, 3), bg = bgOf(el);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const ratio = (a + 0.05) / (b + 0.05);
    const large = parseFloat(cs.fontSize) >= 24 || (parseFloat(cs.fontSize) >= 18.66 && Number(cs.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) bad.push(`${el.tagName}.${el.className} "${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}`);
  }
  return bad;
})()"""


async def open_console(page: Page, port: int, name: str = "overview") -> None:
    await page.goto(f"http://127.0.0.1:{port}/#{name}")
    await page.wait_for("document.body.dataset.ready === '1'", what="the first render with the node's status")


async def show(page: Page, name: str) -> None:
    await page.evaluate(f"location.hash = '#{name}'")
    await page.wait_for(f"!!document.getElementById('page-{name}')", what=f"the {name} page")


async def overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the viewport (0: no horizontal scroll)."""
    return await page.evaluate("Math.max(0, document.documentElement.scrollWidth - window.innerWidth)")


async def contrast_failures(page: Page) -> list[str]:
    return await page.evaluate(_CONTRAST_JS)


async def tab_order(page: Page, presses: int) -> list[str]:
    """What receives focus on each Tab from the top of the page (href, id or tag)."""
    await page.evaluate("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
    seen = []
    for _ in range(presses):
        await page.press("Tab", "Tab", 9)
        seen.append(
            await page.evaluate(
                "(() => { const e = document.activeElement; return e.getAttribute('href') || e.id || e.tagName; })()"
            )
        )
    return seen


async def payload_bytes(page: Page) -> dict:
    """Uncompressed bytes of the page and its console files, as the browser loaded them."""
    return json.loads(
        await page.evaluate("""JSON.stringify(Object.fromEntries(
      [performance.getEntriesByType('navigation')[0], ...performance.getEntriesByType('resource')]
        .filter((e) => new URL(e.name).pathname === '/' || new URL(e.name).pathname.startsWith('/console/'))
        .map((e) => [new URL(e.name).pathname, e.decodedBodySize])))""")
    )


async def first_render(page: Page) -> dict:
    """Milliseconds from navigation start: first contentful paint, and the first render with data."""
    return json.loads(
        await page.evaluate("""JSON.stringify({
      first_contentful_paint_ms: (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime,
      first_render_with_status_ms: (performance.getEntriesByName('hydra-first-render')[0] || {}).startTime,
      dom_content_loaded_ms: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd})""")
    )
