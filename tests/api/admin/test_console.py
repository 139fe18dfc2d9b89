"""The console in a real browser: Debian's Chromium driven by Playwright (never `playwright install`).
Sign in, read the overview and its chart, explain a URL and render it now, pause and resume a node,
sign out; signed out nothing but the sign-in form shows; the effective config, a sitemap's entries
with their states, the page cache with a stored page shown as text, and the bot policies, missed
pages, and serves and verification outcomes per bot class. Screenshots of each view are kept under
test-artifacts/ (git-ignored)."""

from __future__ import annotations

import base64
import re
import shutil
import time

import httpx
import pytest

from prerender_ray.admin.users import hash_password
from tests.localnode import LocalNode
from tests.sitemap_server import SitemapSite, urlset
from tests.support import REPO, result_body, take, wait_for, write_page

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
URL = "https://console.test/products/1"
ARTIFACTS = REPO / "test-artifacts"
SITE_HOST = "console-sitemaps.test"
VIEWS = ("overview", "queue", "explain", "sitemaps", "pages", "bots", "config")
HOSTILE_BOT = '<img src=x onerror="window.pwned=1">'  # a bot name is any string: shown as text


@pytest.fixture(scope="module")
def site():
    s = SitemapSite()
    yield s
    s.server.shutdown()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    users = [
        {"name": "ops", "roles": ["admin"], "passwordHash": hash_password("ops-pass", iterations=1000)},
        {
            "name": "watcher",
            "roles": ["viewer"],
            "passwordHash": hash_password("watch-pass", iterations=1000),
        },
    ]
    d = LocalNode.start(
        tmp_path_factory.mktemp("console") / "data",
        {
            "domains": ["console.test", f"{SITE_HOST}:*"],
            "origin": {"staging": {"ip": "127.0.0.1"}},
            "auth": {"users": users},
            "render": {"reconcile": {"startDelay": "1h"}},
            "management": {"pageSize": 5},
            "sitemap": {"fetchTimeoutMs": 5000},
            # one signature agent allowed (nothing listens there): signatures are checked and counted
            "bots": {"named": {HOSTILE_BOT: {"serve": "prerender"}},
                     "webBotAuth": {"agents": ["http://127.0.0.1:9"]}},
        },
    )
    for i, due in enumerate(
        (1, int(time.time() * 1000) + 3 * 3_600_000, int(time.time() * 1000) + 7_200_000)
    ):
        r = httpx.put(
            f"{d.url}/render_targets",
            json={"url": f"https://console.test/products/{i + 1}", "nextRenderTime": due},
            auth=("ops", "ops-pass"),
            timeout=30,
        )
        assert r.status_code == 200, r.text
    yield d
    d.stop()


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.skip("Debian's chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def test_sign_in_overview_explain_render_now_pause_and_resume(node, browser) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    expected = ("status of 400", "status of 401")  # the wrong password, the URL that is not one
    page.on(
        "console",
        lambda m: (
            problems.append(m.text) if m.type == "error" and not any(e in m.text for e in expected) else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(str(e)))
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(node.url) else None)

    page.goto(f"{node.url}/prerender_admin/")
    page.wait_for_selector("#login-form", state="visible")
    page.fill("#login-username", "ops")
    page.fill("#login-password", "wrong")
    page.click("#login-submit")
    page.wait_for_selector("#login-error:has-text('Invalid credentials')")
    page.fill("#login-username", "ops")
    page.fill("#login-password", "ops-pass")
    page.click("#login-submit")

    # the overview: tiles, the node, the chart
    page.wait_for_selector("#view-overview:visible")
    page.wait_for_selector("tr[data-node='node-a']")
    assert page.text_content("#who-name").startswith("ops (admin")
    page.wait_for_function("document.querySelector('[data-tile=due] .value').textContent !== '-'")
    assert int(page.text_content("[data-tile=due] .value").replace(",", "")) >= 2
    assert page.locator("#histogram svg rect").count() == 25
    page.wait_for_function("document.querySelector('[data-tile=targets] .value').textContent !== '-'")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-overview.png"), full_page=True)

    # the cluster queue-state
    page.click("#tab-queue")
    page.wait_for_selector("#queue-nodes tr[data-node='node-a']")
    assert "every node answered" in page.text_content("#queue-generated")

    # explain a URL, then render it now
    page.click("#tab-explain")
    page.fill("#explain-url", "HTTPS://Console.Test/products/2?utm_source=x#top")
    page.select_option("#explain-device", "mobile")
    page.click("#explain-submit")
    page.wait_for_selector("#explain-result:visible")
    assert page.text_content("[data-fact=canonicalUrl]") == "https://console.test/products/2"
    assert page.text_content("[data-fact=cacheKey]") == "https://console.test/products/2|mobile"
    assert "authoritative" in page.text_content("[data-fact=owner]")
    assert "in 3h" in page.text_content("[data-fact=schedule]") or "in 2h" in page.text_content(
        "[data-fact=schedule]"
    )
    page.click("#render-now")
    page.wait_for_selector("#explain-message:has-text('due now on node-a')")
    assert "ago" in page.text_content("[data-fact=schedule]") or "in 0s" in page.text_content(
        "[data-fact=schedule]"
    )
    page.fill("#explain-url", "not a url")
    page.click("#explain-submit")
    page.wait_for_selector("#explain-error:has-text('Not a valid absolute URL')")

    # pause node-a, then let it inherit the cluster's intent again
    page.click("#tab-overview")
    row = "tr[data-node='node-a']"
    page.click(f"{row} button[data-action=pause]")
    page.wait_for_selector(f"{row} td.intent:has-text('paused (node, by ops)')")
    page.wait_for_selector(f"{row} td.status:has-text('paused')", timeout=30_000)
    claim = httpx.post(
        f"{node.url}/render_queue/claim", json={"limit": 5}, auth=("ops", "ops-pass"), timeout=15
    )
    assert claim.json() == []
    page.screenshot(path=str(ARTIFACTS / "console-paused.png"), full_page=True)
    page.click(f"{row} button[data-action=inherit]")
    page.wait_for_selector(f"{row} td.intent:has-text('running (default)')")
    page.wait_for_function(
        "!document.querySelector(\"tr[data-node='node-a'] td.status\").textContent.includes('paused')",
        timeout=30_000,
    )

    # a live override: dry run, apply, see it listed, clear it
    page.click("#tab-config")
    page.wait_for_selector("#override-path option[value='render.defaultInterval']", state="attached")
    page.select_option("#override-path", "render.defaultInterval")
    page.fill("#override-value", '"12h"')
    page.click("#override-dry")
    page.wait_for_selector("#message:has-text('dry run: nothing written')")
    assert page.locator("tr[data-override]").count() == 0
    page.fill("#override-note", "console test")
    page.click("#override-apply")
    page.wait_for_selector("tr[data-override='render.defaultInterval']:has-text('12h')")
    assert "console test" in page.text_content("tr[data-override='render.defaultInterval']")
    cfg = httpx.get(f"{node.url}/prerender_admin/config", auth=("ops", "ops-pass"), timeout=10).json()
    assert cfg["config"]["render"]["default_interval"] == 43_200_000
    page.fill("#override-value", "not json")
    page.click("#override-apply")
    page.wait_for_selector("#message:has-text('not JSON')")
    page.click("tr[data-override='render.defaultInterval'] button[data-action=clear]")
    page.wait_for_selector("tr[data-override]", state="detached")

    # sign out: the session is gone, the form is back
    page.click("#logout")
    page.wait_for_selector("#login-form", state="visible")
    page.reload()
    page.wait_for_selector("#login-form", state="visible")
    assert problems == [] and outside == []
    page.close()


def test_a_viewer_sees_no_admin_controls(node, browser) -> None:
    page = browser.new_page()
    page.goto(f"{node.url}/prerender_admin/")
    page.fill("#login-username", "watcher")
    page.fill("#login-password", "watch-pass")
    page.click("#login-submit")
    page.wait_for_selector("tr[data-node='node-a']")
    assert page.locator("#cluster-pause").is_hidden()
    assert page.locator("tr[data-node='node-a'] button[data-action=pause]").is_hidden()
    page.click("#tab-config")
    page.wait_for_selector("#config-live:has-text('without a restart')")
    assert page.locator("#override-form").is_hidden()
    assert page.eval_on_selector("#render-diagnose", "b => getComputedStyle(b).display") == "none"
    page.close()


# ------------------------------------------------------------- signed out; config, sitemaps, pages


def sign_in(page, node, who: str = "ops", password: str = "ops-pass") -> None:
    page.goto(f"{node.url}/prerender_admin/")
    page.fill("#login-username", who)
    page.fill("#login-password", password)
    page.click("#login-submit")
    page.wait_for_selector("#view-overview:visible")


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def nothing_but_the_sign_in_form(page) -> None:
    page.wait_for_selector("#login-form", state="visible")
    assert not page.is_visible("#tabs") and not page.is_visible("#who") and not page.is_visible("#logout")
    for v in VIEWS:
        assert not page.is_visible(f"#tab-{v}"), v
        assert not page.is_visible(f"#view-{v}"), v


def test_signed_out_only_the_sign_in_form_shows(node, browser, tmp_path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 700})
    page.goto(f"{node.url}/prerender_admin/")
    nothing_but_the_sign_in_form(page)
    page.screenshot(path=str(tmp_path / "signed-out.png"))
    assert (tmp_path / "signed-out.png").stat().st_size > 0
    # signing out from any view (the config one included) hides every view and the data it held
    sign_in(page, node)
    assert page.is_visible("#tabs") and page.is_visible("#logout")
    page.click("#tab-config")
    page.wait_for_selector("tr[data-option='server.port']")
    page.click("#logout")
    nothing_but_the_sign_in_form(page)
    assert page.locator("tr[data-option]").count() == 0
    page.close()


def test_the_config_tab_shows_the_effective_config_redacted(node, browser) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, node, "watcher", "watch-pass")
    page.click("#tab-config")
    page.wait_for_selector("tr[data-option='server.port']")
    assert page.text_content("tr[data-option='server.data_dir'] td:nth-child(2)") == str(node.data_dir)
    assert SITE_HOST in page.text_content("tr[data-option='domains']")
    assert page.text_content("tr[data-option='management.page_size'] td:nth-child(2)") == "5"
    assert page.text_content("tr[data-option='auth.session_secret'] td:nth-child(2)").startswith("<set: ")
    assert "pbkdf2" not in page.content()  # password hashes never reach the page
    shot(page, "console-config.png")
    page.fill("#config-filter", "server.port")
    assert page.is_visible("tr[data-option='server.port']")
    assert not page.is_visible("tr[data-option='domains']")
    page.close()


def test_the_sitemaps_tab_lists_the_root_and_its_entries_with_their_state(node, browser, site) -> None:
    locs = [f"https://console.test/sm/{i}" for i in range(5)] + ["https://console.test/search/x", "not a url"]
    site.put("/console-sitemap.xml", urlset(*locs))
    root = site.url("/console-sitemap.xml", host=SITE_HOST)
    r = httpx.post(
        f"{node.url}/sitemaps", json={"url": root, "background": False}, timeout=300, auth=("ops", "ops-pass")
    )
    assert r.status_code == 200, r.text
    write_page(node, "https://console.test/sm/0|desktop", b"<html>0</html>")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, node, "watcher", "watch-pass")
    page.click("#tab-sitemaps")
    row = f"tr[data-sitemap='{root}']"
    page.wait_for_selector(row)
    assert "completed" in page.text_content(f"{row} td.run")
    assert page.text_content(f"{row} td:nth-child(3)") == "7"
    page.click(f"{row} button")
    page.wait_for_selector("#sitemap-detail:visible")
    page.wait_for_selector("tr[data-entry='0']")
    assert page.text_content("[data-fact=targetCount]") == "5"
    assert "completed" in page.text_content("[data-fact=run]")
    state = "tr[data-entry='{}'] td.state"
    assert page.text_content(state.format(0)) == "cached"
    assert page.text_content(state.format(1)) == "scheduled"
    assert page.locator("tr[data-entry]").count() == 5 and page.is_disabled("#sitemap-prev")
    shot(page, "console-sitemaps.png")
    page.click("#sitemap-next")
    page.wait_for_selector("tr[data-entry='5']")
    assert page.text_content(state.format(5)) == "filtered"
    assert page.text_content(state.format(6)) == "invalid"
    assert page.is_disabled("#sitemap-next")
    page.click("#sitemap-prev")
    page.wait_for_selector("tr[data-entry='0']")
    page.close()


def test_the_bots_tab_shows_the_policies_and_the_pages_bots_missed(node, browser) -> None:
    googlebot = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"}
    missed = "https://console.test/missed/1"
    for _ in range(2):  # no cached page: the origin answers (here it refuses: nothing listens on :80)
        httpx.get(f"{node.url}/p/{missed}", headers=googlebot, timeout=30)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, node, "watcher", "watch-pass")
    page.click("#tab-bots")
    page.wait_for_selector("tr[data-policy='search']")
    assert page.text_content("tr[data-policy='search'] td.serve") == "prerender"
    assert page.locator("tr[data-policy]").count() == 7  # every class, and the one named bot
    assert "Verification off" in page.text_content("#bot-facts")
    page.wait_for_selector("tr[data-class='search']")
    row = page.locator("tr[data-class='search']", has_text=missed)
    assert row.locator("td.num").text_content() == "2" and "Googlebot" in row.text_content()
    assert not page.is_visible("#bot-missed-empty")
    shot(page, "console-bots.png")
    page.click("#logout")  # what it showed goes with the user
    nothing_but_the_sign_in_form(page)
    assert page.locator("tr[data-policy]").count() == 0 and page.locator("tr[data-class]").count() == 0
    page.close()


def test_the_bots_tab_shows_serves_verification_and_markdown_per_class(node, browser) -> None:
    # seo-tool; a miss's origin fetch pinned to 127.0.0.1 (staging), where nothing listens
    ahrefs = {"user-agent": "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
              "x-harper-staging": "1"}
    write_page(node, "https://console.test/bots/md|desktop", b"<html><body><h1>For agents</h1></body></html>")
    sent = 0

    def markdown() -> bool:  # a miss until the ingress sees the written page, then a Markdown hit
        nonlocal sent
        sent += 1
        r = httpx.get(f"{node.url}/p/https://console.test/bots/md", headers={**ahrefs, "accept": "text/markdown"},
                      timeout=30)
        return r.headers.get("content-type", "").startswith("text/markdown")

    wait_for(markdown, what="the written page served as Markdown")
    httpx.get(f"{node.url}/p/https://console.test/bots/missed", headers=ahrefs, timeout=30)
    sent += 1
    # a Web Bot Auth signature without its Signature field: refused as malformed, counted for the class claimed
    httpx.get(f"{node.url}/p/https://console.test/bots/signed", timeout=30, headers={
        "user-agent": "Twitterbot/1.0", "x-harper-staging": "1",
        "signature-input": 'sig1=("@authority");tag="web-bot-auth"'})
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, node, "watcher", "watch-pass")
    page.click("#tab-bots")
    row = "#bot-classes tr[data-bot-class='seo-tool']"
    page.wait_for_selector(row)
    assert page.locator("#bot-classes tr[data-bot-class]").count() == 6
    assert page.text_content(f"{row} td.serves") == str(sent)
    assert page.text_content(f"{row} td.verification") == f"unchecked {sent}"
    assert page.text_content(f"{row} td.method") == f"none {sent}"
    assert page.text_content(f"{row} td.markdown") == "1"
    assert page.text_content(f"{row} td.misses") == str(sent - 1)
    assert page.text_content("#bot-outcomes tr[data-outcome='social/signature/malformed'] td.num") == "1"
    assert not page.is_visible("#bot-outcomes-empty")
    assert "1 signature agent(s) allowed" in page.text_content("#bot-facts")
    names = page.eval_on_selector_all("#bot-policies tbody tr", "rows => rows.map((r) => r.cells[0].textContent)")
    assert HOSTILE_BOT in names  # as text: no element made of it, nothing run
    assert page.locator("#view-bots img").count() == 0 and page.evaluate("window.pwned") is None
    shot(page, "console-bot-classes.png")
    page.click("#logout")
    nothing_but_the_sign_in_form(page)
    assert page.locator("tr[data-bot-class]").count() == 0 and page.locator("tr[data-outcome]").count() == 0
    page.close()


def test_a_status_reads_as_the_queues_and_the_bots_tab_says_whose_figures(node, browser) -> None:
    """Before: the overview showed a bare ``empty``, in green, beside a node holding pages, and the
    Bots tab one replica's tallies as the node's."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, node, "watcher", "watch-pass")
    cell = "tr[data-node='node-a'] td.status"
    page.wait_for_selector(f"{cell}:has-text('queue: ')")
    assert re.fullmatch(r"queue: (empty|queued|paused|unready) \u2014 [a-z ]+", page.text_content(cell))
    assert page.text_content("#nodes thead th:nth-child(2)") == "Queue status"
    page.click("#tab-queue")
    page.wait_for_selector("#queue-nodes tr[data-node='node-a'] td:has-text('queue: ')")
    page.click("#tab-bots")
    page.wait_for_selector("#bots-generated:has-text('merged from')")
    replicas = node.config.get("server", {}).get("replicas", 2)
    assert page.text_content("#bots-generated") == f"merged from {replicas} of {replicas} ingress replicas, all nodes"
    page.close()


def test_the_pages_tab_lists_cached_pages_and_shows_their_html_as_text(node, browser) -> None:
    keys = [f"https://console.test/pg/{i}|desktop" for i in range(6)]
    markup = "<html><body><b id=injected>bold</b><script>window.pwned = 1</script></body></html>"
    for k in keys:
        write_page(node, k, markup.encode())
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    sign_in(page, node, "watcher", "watch-pass")
    page.click("#tab-pages")
    page.fill("#pages-prefix", "https://console.test/pg/")
    page.click("#pages-submit")
    first = f"tr[data-page='{keys[0]}']"
    page.wait_for_selector(first)
    assert page.locator("tr[data-page]").count() == 5
    assert page.text_content(f"{first} td:nth-child(2)") == "desktop"
    assert page.text_content(f"{first} td:nth-child(3)") == "200"
    assert page.text_content(f"{first} td:nth-child(6)") == "fresh"
    page.click("#pages-next")
    page.wait_for_selector(f"tr[data-page='{keys[5]}']")
    assert page.locator("tr[data-page]").count() == 1 and page.is_disabled("#pages-next")
    page.click(f"tr[data-page='{keys[5]}'] button[data-action=view]")
    page.wait_for_selector("#page-view:visible")
    assert page.text_content("#page-view-text") == markup
    assert page.locator("#page-view-text *").count() == 0 and page.locator("#injected").count() == 0
    assert page.evaluate("window.pwned") is None
    assert "stored HTTP 200" in page.text_content("#page-view-status")
    shot(page, "console-pages.png")
    assert problems == []
    page.close()


def test_a_read_refused_as_busy_is_asked_again_after_retry_after(node, browser) -> None:
    # The overview's fan-out can hold the replica's heavy-read slots while a tab is switched: the
    # listing that meets the 429 must still arrive (before: an empty table and "busy").
    key = "https://console.test/busy/0|desktop"
    write_page(node, key, b"<html><body>busy</body></html>")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def busy_twice(route) -> None:
        if len(refused) < 2:
            refused.append(route.request.url)
            route.fulfill(status=429, headers={"retry-after": "1", "content-type": "application/json"},
                          body='{"error": "Too many heavy admin reads in flight"}')
        else:
            route.continue_()

    sign_in(page, node, "watcher", "watch-pass")
    page.route("**/prerender_admin/pages?*", busy_twice)
    page.click("#tab-pages")
    page.fill("#pages-prefix", "https://console.test/busy/")
    page.click("#pages-submit")
    page.wait_for_selector(f"tr[data-page='{key}']", timeout=15_000)
    assert len(refused) == 2 and page.text_content("#pages-error") == ""
    page.close()


def test_a_diagnostics_report_with_a_screenshot_shows_in_the_explainer_and_beside_the_page(node, browser) -> None:
    url, key, ops = "https://console.test/products/3", "https://console.test/products/3|desktop", ("ops", "ops-pass")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_content("<body style='margin:0;background:#c22'><h1>as the worker saw it</h1></body>")
    jpeg = page.screenshot(type="jpeg", quality=60, clip={"x": 0, "y": 0, "width": 160, "height": 120})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    sign_in(page, node)
    page.click("#tab-explain")
    page.fill("#explain-url", url)
    page.select_option("#explain-device", "desktop")
    page.click("#explain-submit")
    page.wait_for_selector("#explain-result:visible")
    page.click("#render-diagnose")
    page.wait_for_selector("#explain-message:has-text('with diagnostics')")

    job = take(node.url, [key], auth=ops)[key]  # what prerender-ray's worker would claim
    assert job["renderOptions"] == {"diagnostics": True}
    hostile = "<img id=injected src=x onerror=window.pwned=1>"
    report = {"console": [{"level": "error", "text": hostile, "at": 12}, {"level": "warning", "text": "slow", "at": 5}],
              "exceptions": [{"message": "Error: boom on scroll", "at": 20}], "failedRequests": [],
              "blockedRequests": [{"url": "https://www.googletagmanager.com/gtm.js"}],
              "timeline": [{"at": 0, "event": "navigate", "detail": ""}, {"at": 640, "event": "settled", "detail": ""}],
              "chars": 999, "truncated": {"console": 4},
              "screenshot": {"type": "image/jpeg", "width": 160, "height": 120, "data": base64.b64encode(jpeg).decode()}}
    body, headers = result_body(job, diagnostics=report,
                                renderSummary={"errors": 2, "blocked": 1, "failed": 0, "chars": 999, "scrollSteps": 0})
    r = httpx.post(f"{node.url}/render_queue/job_result", content=body, headers=headers, auth=ops, timeout=30)
    assert r.status_code == 204, r.text

    page.click("#explain-submit")
    row = "#explain-history tr[data-history]"
    page.wait_for_selector(row)
    cells = page.locator(f"{row} td").all_text_contents()
    assert cells[1] == "800 ms" and cells[2] == "rendered" and cells[5:9] == ["2", "1", "0", "999"]
    img = "#explain-reports .report img"
    page.wait_for_selector(img)
    # polled from here: the page's CSP (no eval) refuses a predicate polled inside it
    wait_for(lambda: page.eval_on_selector(img, "i => i.complete && i.naturalWidth") == 160, timeout=10,
             what="the screenshot decoded")
    text = page.text_content("#explain-reports")
    for part in (hostile, "Error: boom on scroll", "googletagmanager.com/gtm.js", "settled", "999 characters",
                 "console 4"):
        assert part in text, part
    assert page.locator("#injected").count() == 0 and page.evaluate("window.pwned") is None
    shot(page, "console-diagnostics.png")

    page.click("#tab-pages")
    page.fill("#pages-prefix", key)
    page.click("#pages-submit")
    page.click(f"tr[data-page='{key}'] button[data-action=view]")
    page.wait_for_selector("#page-view-reports .report img")
    assert "Error: boom on scroll" in page.text_content("#page-view-reports")
    assert problems == []
    page.close()
