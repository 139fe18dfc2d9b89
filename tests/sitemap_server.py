"""A small threaded HTTP server on 127.0.0.1 serving sitemaps, hostile ones included (the outside world
of the sitemap tests: the only fake allowed)."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"

Handler = Callable[[BaseHTTPRequestHandler], None]


def urlset(*entries: str | tuple[str | None, str | None] | tuple[str | None, str | None, str]) -> bytes:
    """A urlset of ``loc`` strings, ``(loc, changefreq)`` pairs or ``(loc, changefreq, lastmod)``
    (a None loc gives ``<url/>``)."""
    rows = []
    for e in entries:
        loc, freq, lastmod = (e, None, None) if isinstance(e, str) else (*e, None)[:3]
        parts = [f"<loc>{loc}</loc>"] if loc is not None else []
        parts += [f"<lastmod>{lastmod}</lastmod>"] if lastmod else []
        parts += [f"<changefreq>{freq}</changefreq>"] if freq else []
        rows.append(f"<url>{''.join(parts)}</url>")
    return f'<?xml version="1.0"?><urlset xmlns="{NS}">{"".join(rows)}</urlset>'.encode()


def index(*locs: str) -> bytes:
    rows = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f'<?xml version="1.0"?><sitemapindex xmlns="{NS}">{rows}</sitemapindex>'.encode()


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://shop.test/&lol3;</loc></url></urlset>"""

XXE = b"""<?xml version="1.0"?>
<!DOCTYPE urlset [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>https://shop.test/&xxe;</loc></url></urlset>"""

HTML = b"<!DOCTYPE html><html><head><title>403 Forbidden</title></head><body>Access Denied</body></html>"


def gzip_bomb(mb: int = 200) -> bytes:
    """``mb`` MB of whitespace inside a urlset, gzipped to a few hundred KB, built without holding it."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(f'<urlset xmlns="{NS}">'.encode())]
    block = b" " * (1 << 20)
    out += [z.compress(block) for _ in range(mb)]
    out.append(z.compress(b"</urlset>") + z.flush())
    return b"".join(out)


class SitemapSite:
    """Routes by path: static bodies, or handlers for slow, endless or hanging responses. Records the
    request headers of every hit."""

    def __init__(self) -> None:
        site = self
        self.routes: dict[str, Any] = {}
        self.slow: dict[str, bytes] = {}  # delayed documents, by path
        self.hits: dict[str, int] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.lock = threading.Lock()

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                path = self.path
                with site.lock:
                    site.hits[path] = site.hits.get(path, 0) + 1
                    site.headers[path] = {k.lower(): v for k, v in self.headers.items()}
                    route = site.routes.get(path)
                try:
                    if route is None:
                        self._send(404, b"<html><body>Not Found</body></html>", "text/html")
                    elif callable(route):
                        route(self)
                    else:
                        status, body, ctype, extra = route
                        self._send(status, body, ctype, extra)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _send(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def put(self, path: str, body: bytes, *, status: int = 200, ctype: str = "application/xml",
            headers: dict | None = None) -> None:
        self.routes[path] = (status, body, ctype, headers)

    def handle(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    def delayed(self, path: str, body: bytes, delay: float) -> None:
        """Answers after ``delay`` seconds (longer than the fetch deadline: a child that hangs)."""

        def slow(h: BaseHTTPRequestHandler) -> None:
            time.sleep(delay)
            h._send(200, body, "application/xml")  # type: ignore[attr-defined]

        self.routes[path] = slow
        self.slow[path] = body

    def hurry(self) -> None:
        """Every delayed document answers at once from now on (a later test walks every root)."""
        for path, body in self.slow.items():
            self.put(path, body)
        self.slow.clear()

    def endless(self, path: str) -> None:
        """A sitemap body that never ends (a 2 GB sitemap, streamed): valid entries, forever."""

        def stream(h: BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("content-type", "application/xml")
            h.send_header("content-length", str(2 * 1024**3))
            h.end_headers()
            h.wfile.write(f'<urlset xmlns="{NS}">'.encode())
            # rows of 200+ bytes: the byte cap, not the entry cap, is what stops it
            row = (b"<url><loc>https://shop.test/endless/" + b"p" * 150 +
                   b"</loc><changefreq>daily</changefreq></url>\n") * 400
            for _ in range(2 * 1024**3 // len(row)):
                h.wfile.write(row)

        self.routes[path] = stream

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.routes[path] = (status, b"", "text/plain", {"location": location})

    def gzipped(self, path: str, body: bytes, *, transport: bool = False) -> None:
        """A gzip file (``.xml.gz`` served as bytes), or gzip as the transport's content-encoding."""
        headers = {"content-encoding": "gzip"} if transport else None
        ctype = "application/xml" if transport else "application/x-gzip"
        self.put(path, gzip.compress(body), ctype=ctype, headers=headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
