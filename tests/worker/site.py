"""Fakes of the outside world for the worker's tests: an origin site and a queue server on 127.0.0.1,
each a threaded HTTP/1.1 server recording what it was sent.

The origin serves pages whose content a script builds, pages that settle late, never settle, are
noindex, 404, redirect (once, to another origin, in a loop), are huge, and a sitemap listing some of
them. The fake queue answers claims from a list the test fills, or misbehaves on request (down,
slow, garbage, 503 with Retry-After), and records every result posted.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float



SHADOW_JS = """<script>
customElements.define('x-card', class extends HTMLElement { constructor() { super();
  const r = this.attachShadow({mode: 'open'}); const sheet = new CSSStyleSheet();
  sheet.replaceSync('p { color: rebeccapurple; }'); r.adoptedStyleSheets = [sheet];
  r.innerHTML = '<p>shadow text <slot></slot></p><x-inner></x-inner><script>window.bad = 1</' + 'script>'; } });
customElements.define('x-inner', class extends HTMLElement { constructor() { super();
  this.attachShadow({mode: 'open'}).innerHTML = '<b>nested text</b>'; } });
customElements.define('x-closed', class extends HTMLElement { constructor() { super();
  this.attachShadow({mode: 'closed'}).innerHTML = '<i>closed text</i>'; } });
customElements.define('x-deep', class extends HTMLElement { constructor() { super();
  const host = this.getRootNode().host; const depth = (host ? host.depth : 0) + 1;
  this.depth = depth;  // a property: a parser-made element must not get attributes in its constructor
  this.attachShadow({mode: 'open'}).innerHTML = depth < 60 ? '<x-deep></x-deep>' : '<u>bottom</u>'; } });
</script>"""

class _Server:
    """A ThreadingHTTPServer whose handler calls ``self.handle(request) -> (status, headers, body)``."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                seen = Seen(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.time(),
                )
                outer.seen.append(seen)
                try:
                    status, headers, payload = outer.handle(seen)
                except Exception as e:  # pragma: no cover - a bug in the fake
                    status, headers, payload = 500, {}, repr(e).encode()
                if status == 0:  # drop the connection without an answer
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = do_POST = do_HEAD = do_PUT = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def handle(self, req: Seen) -> tuple[int, dict[str, str], bytes]:  # pragma: no cover
        raise NotImplementedError

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> _Server:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path.split("?")[0] == path]


HTML = {"content-type": "text/html; charset=utf-8"}


def page(title: str, body: str, head: str = "") -> bytes:
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title>{head}</head>"
        f"<body>{body}</body></html>"
    ).encode()


class Origin(_Server):
    """The site being prerendered. ``third_party`` is another origin its pages reference."""

    def __init__(self, third_party: str = "") -> None:
        super().__init__()
        self.third_party = third_party
        self.extra: dict[str, Callable[[Seen], tuple[int, dict[str, str], bytes]]] = {}
        self.sitemap_paths: list[str] = []

    def handle(self, req: Seen) -> tuple[int, dict[str, str], bytes]:
        path = req.path.split("?")[0]
        if path in self.extra:
            return self.extra[path](req)
        base = self.base
        if path.startswith("/js/"):  # content built by a script that fetches data, plus JSON-LD kept
            n = path.rsplit("/", 1)[1]
            return (
                200,
                {
                    **HTML,
                    "etag": f'"js-{n}"',
                    "cache-control": "max-age=60",
                    "set-cookie": "s=1",
                    "x-secret": "no",
                },
                page(
                    f"JS {n}",
                    f"<h1>Page {n}</h1><div id=app>loading</div><img src=/img/{n}.png>",
                    head='<script src="/app.js"></script><link rel=stylesheet href="/style.css">'
                    '<script type="application/ld+json">{"@type":"WebPage"}</script>',
                ),
            )
        if path == "/app.js":
            return (
                200,
                {"content-type": "text/javascript"},
                (
                    b"addEventListener('DOMContentLoaded', () => {"
                    b" const n = location.pathname.split('/').pop();"
                    b" fetch('/data/' + n + '.json').then(r => r.json()).then(d => {"
                    b"  document.getElementById('app').textContent = 'built by script: ' + d.title; }); });"
                ),
            )
        if path.startswith("/data/"):
            n = path.rsplit("/", 1)[1].removesuffix(".json")
            return 200, {"content-type": "application/json"}, json.dumps({"title": f"item {n}"}).encode()
        if path == "/style.css":
            return 200, {"content-type": "text/css"}, b"body { color: #333 }"
        if path.startswith("/img/") or path.startswith("/font"):
            return 200, {"content-type": "image/png"}, b"\x89PNG\r\n\x1a\n" + b"\0" * 64
        if path == "/late":  # prerenderReady set late, after a timer
            return (
                200,
                HTML,
                page(
                    "Late",
                    "<div id=app>waiting</div>",
                    head=(
                        "<script>window.prerenderReady = false; setTimeout(() => {"
                        " document.getElementById('app').textContent = 'ready at last'; window.prerenderReady = true;"
                        " }, 1200);</script>"
                    ),
                ),
            )
        if path == "/never-ready":
            return (
                200,
                HTML,
                page("Never", "<div>never</div>", head="<script>window.prerenderReady = false</script>"),
            )
        if path == "/busy":  # keeps the network busy forever
            return (
                200,
                HTML,
                page(
                    "Busy",
                    "<div id=app>busy</div>",
                    head=(
                        "<script>setInterval(() => fetch('/data/tick.json?' + Math.random()), 50)</script>"
                    ),
                ),
            )
        if path == "/noindex":
            return (
                200,
                {**HTML, "x-robots-tag": "noarchive"},
                page("Noindex", "<p>hidden</p>", head='<meta name="ROBOTS" content="NoIndex, follow">'),
            )
        if path == "/canonical-elsewhere":
            return 200, HTML, page("Canon", "<p>copy</p>", head='<link rel="canonical" href="/js/1">')
        if path == "/canonical-self":
            return (
                200,
                HTML,
                page("Canon", "<p>mine</p>", head=f'<link rel="canonical" href="{base}/canonical-self/">'),
            )
        if path == "/missing":
            return 404, {**HTML, "x-robots-tag": "noindex"}, page("Missing", "<p>not here</p>")
        if path == "/broken":
            return 500, HTML, page("Broken", "<p>oops</p>")
        if path == "/moved":
            return 301, {"location": "/js/moved-here", "cache-control": "max-age=3600"}, b""
        if path == "/moved-query":
            return 302, {"location": "/js/3?ref=x"}, b""
        if path == "/moved-away":
            return 301, {"location": f"{self.third_party}/landing"}, b""
        if path == "/loop":
            return 302, {"location": "/loop2"}, b""
        if path == "/loop2":
            return 302, {"location": "/loop"}, b""
        if path == "/client-redirect":
            return (
                200,
                HTML,
                page("Go", "<p>going</p>", head="<script>location.replace('/js/landed')</script>"),
            )
        if path == "/throws":
            return (
                200,
                HTML,
                page(
                    "Throws",
                    "<div id=app>static</div>",
                    head=(
                        "<script>document.addEventListener('DOMContentLoaded', () => {"
                        " document.getElementById('app').textContent = 'before the throw'; null.boom(); })</script>"
                    ),
                ),
            )
        if path == "/third-party":
            return (
                200,
                HTML,
                page(
                    "3p",
                    "<div id=app></div>",
                    head=(
                        f'<script src="/app.js"></script><script src="{self.third_party}/lib.js"></script>'
                    ),
                ),
            )
        if path == "/tracked":  # an analytics script on a blocked host beside a library on an allowed one
            tracker = self.third_party.replace("//127.0.0.1:", "//analytics.localhost:")
            return 200, HTML, page("Tracked", "<p>tracked page</p>", head=(
                f'<script src="{tracker}/track.js"></script><script src="{self.third_party}/lib.js"></script>'))
        if path == "/lazy":  # a section fetched when its sentinel scrolls into view, a lazy image's src
            return 200, HTML, page("Lazy", (
                '<p>first screen</p><div style="height:3000px"></div><div id=sentinel></div>'
                '<img class=lazy data-src="/img/lazy.png" alt=lazy>'), head=(
                "<script>addEventListener('DOMContentLoaded', () => {"
                "  const io = new IntersectionObserver(es => es.forEach(e => { if (!e.isIntersecting) return;"
                "    io.disconnect(); const img = document.querySelector('img.lazy'); img.src = img.dataset.src;"
                "    fetch('/data/lazy.json').then(r => r.json()).then(d => { const s = document.createElement('section');"
                "      s.textContent = 'lazy section: ' + d.title; document.body.appendChild(s); }); }));"
                "  io.observe(document.getElementById('sentinel')); });</script>"))
        if path == "/feed":  # an endless feed that also throws on every scroll: bounded, never hung
            return 200, HTML, page("Feed", '<div id=feed><p style="height:2000px">post 0</p></div>', head=(
                "<script>let n = 0; addEventListener('scroll', () => {"
                "  if (innerHeight + scrollY >= document.body.scrollHeight - 100) { const p = document.createElement('p');"
                "    p.style.height = '2000px'; p.textContent = 'post ' + (++n); document.getElementById('feed').appendChild(p); }"
                "  throw new Error('scroll handler failed ' + n); });</script>"))
        if path == "/widget":  # a chat widget on a host that only a route's blocklist names
            chat = self.third_party.replace("//127.0.0.1:", "//chat.localhost:")
            return 200, HTML, page("Widget", "<p>widget page</p>", head=(
                f'<script src="{chat}/chat.js"></script><script src="{self.third_party}/lib.js"></script>'))
        if path == "/noisy":  # what a diagnostics report is for: errors, noise, a failed and a blocked request
            tracker = self.third_party.replace("//127.0.0.1:", "//analytics.localhost:")
            return 200, HTML, page("Broken", '<p>broken page</p><div style="height:50000px"></div>', head=(
                f'<script src="{tracker}/track.js"></script>'
                "<script>console.warn('deprecated thing'); for (let i = 0; i < 1000; i++) console.error('noise ' + i);"
                "fetch('http://127.0.0.1:9/refused').catch(() => {});"
                "setTimeout(() => { throw new Error('widget exploded'); }, 0);</script>"))
        if path == "/status-meta":
            return (
                200,
                HTML,
                page("Gone", "<p>gone</p>", head='<meta name="prerender-status-code" content="410">'),
            )
        if path == "/shadow":  # web components: text only in shadow roots, open, nested and closed
            return (
                200,
                HTML,
                page("Shadow", '<x-card>light child</x-card><x-closed></x-closed>'
                     '<div id=dsd><template shadowrootmode="open"><span>declarative text</span></template></div>',
                     head=SHADOW_JS),
            )
        if path == "/shadow-many":  # thousands of open roots, recursive: bounded, never hung
            return 200, HTML, page("Many", "<x-deep></x-deep>" * 160, head=SHADOW_JS)  # 9,600 roots, 5,120 within depth
        if path == "/status-meta-twice":  # conflicting metas: the first of each name counts
            return (
                200,
                HTML,
                page("Twice", "<p>moved</p>", head=(
                    '<meta name="prerender-status-code" content="301"><meta name="prerender-status-code" content="404">'
                    '<meta name="prerender-header" content="X-Other: 1">'
                    '<meta name="prerender-header" content="Location: ../js/first">'
                    '<meta name="prerender-header" content="Location: /js/second">')),
            )
        if path == "/device":  # what the page sees of its device
            return (
                200,
                HTML,
                page(
                    "Device",
                    "<div id=app></div>",
                    head=(
                        '<meta name="viewport" content="width=device-width">'
                        "<script>addEventListener('DOMContentLoaded', () => { document.getElementById('app').textContent ="
                        " 'width=' + innerWidth + ' touch=' + ('ontouchstart' in window) + ' ua=' + navigator.userAgent; })"
                        "</script>"
                    ),
                ),
            )
        if path == "/debounce":  # content fetched after a short timer, as debounced widgets do
            return (
                200,
                HTML,
                page(
                    "Debounce",
                    "<div id=app>empty</div>",
                    head=(
                        "<script>addEventListener('load', () => setTimeout(() => fetch('/data/debounced.json')"
                        ".then(r => r.json()).then(d => { document.getElementById('app').textContent = 'after timer: '"
                        " + d.title; }), 300));</script>"
                    ),
                ),
            )
        if path == "/slow":  # the document itself takes seconds
            time.sleep(3)
            return 200, HTML, page("Slow", "<p>slow</p>")
        if path == "/hang":  # an endless script: the renderer never answers
            return 200, HTML, page("Hang", "<p>hang</p>", head="<script>while (true) {}</script>")
        if path.startswith("/huge/"):
            n = int(path.rsplit("/", 1)[1])
            chunk = "".join(f"<p>paragraph {i} of a very long page</p>" for i in range(n))
            return 200, HTML, page("Huge", chunk)
        if path == "/sitemap.xml":
            urls = "".join(f"<url><loc>{base}{p}</loc></url>" for p in self.sitemap_paths)
            return (
                200,
                {"content-type": "application/xml"},
                (
                    '<?xml version="1.0" encoding="UTF-8"?>'
                    f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
                ).encode(),
            )
        return 404, HTML, page("404", "<p>no such page</p>")


class ThirdParty(_Server):
    def handle(self, req: Seen) -> tuple[int, dict[str, str], bytes]:
        if req.path == "/lib.js":
            return 200, {"content-type": "text/javascript"}, b"window.lib = 1;"
        return 200, HTML, page("Elsewhere", "<p>landing</p>")


@dataclass
class FakeQueue(_Server):
    """A queue server speaking the fleet protocol, scripted by the test."""

    jobs: list[dict] = field(default_factory=list)
    mode: str = "ok"  # ok | garbage | object | unavailable | error | slow | drop
    retry_after: str | None = None
    slow_s: float = 3.0
    result_statuses: list[int] = field(default_factory=list)  # answers to result posts, then 204
    status_rows: list[dict] | None = None

    def __post_init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def handle(self, req: Seen) -> tuple[int, dict[str, str], bytes]:
        if req.path == "/render_queue/claim":
            if self.mode == "garbage":
                return 200, {"content-type": "application/json"}, b"<html>not json</html>"
            if self.mode == "object":
                return 200, {"content-type": "application/json"}, b'{"jobs": []}'
            if self.mode == "unavailable":
                return 503, {"retry-after": self.retry_after} if self.retry_after else {}, b"busy"
            if self.mode == "error":
                return 500, {}, b"broken"
            if self.mode == "drop":
                return 0, {}, b""
            if self.mode == "slow":
                time.sleep(self.slow_s)
            limit = json.loads(req.body or b"{}").get("limit", 20)
            with self.lock:
                out, self.jobs = self.jobs[:limit], self.jobs[limit:]
            return 200, {"content-type": "application/json"}, json.dumps(out).encode()
        if req.path == "/render_queue/job_result":
            with self.lock:
                status = self.result_statuses.pop(0) if self.result_statuses else 204
            return status, {}, b""
        if req.path == "/queue_status" and self.status_rows is not None:
            return 200, {"content-type": "application/json"}, json.dumps(self.status_rows).encode()
        return 404, {}, b""

    def claims(self) -> list[Seen]:
        return self.requests("/render_queue/claim")

    def results(self) -> list[dict]:
        """Every result posted, decoded: metadata plus ``_content`` (the encoded bytes)."""
        out = []
        for s in self.requests("/render_queue/job_result"):
            size = int(s.headers["x-metadata-size"])
            meta = json.loads(s.body[:size])
            meta["_content"] = s.body[size:]
            meta["_headers"] = s.headers
            out.append(meta)
        return out

    def job(
        self,
        url: str,
        *,
        key: str | None = None,
        device: str = "desktop",
        lease_ms: float = 600_000,
        sitemap: bool = False,
        **extra: Any,
    ) -> dict:
        return {
            "id": key or f"{url}|{device}",
            "url": url,
            "deviceType": device,
            "expiresAt": time.time() * 1000 + lease_ms,
            "callbackOrigin": self.base,
            "isFromSitemap": sitemap,
            **extra,
        }
