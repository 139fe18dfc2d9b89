"""A real origin site for bot-path tests: a small HTTP/1.1 server on 127.0.0.1 in its own thread.

Written on asyncio streams rather than a framework so a test can make it misbehave precisely: hang
before the head, stream without end, close mid-body, send an oversized head. Every request is
recorded (method, path, headers, body) so tests can check what the origin was sent and how often.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections import Counter
from dataclasses import dataclass, field

JS_PAGE = (b"<!doctype html><html><head><title>JS page</title></head><body><div id=app></div>"
           b"<script>document.getElementById('app').textContent='hello from js'</script></body></html>")


@dataclass
class Seen:
    method: str
    path: str  # without the query
    target: str  # as requested, query included
    headers: dict[str, str]
    body: bytes


@dataclass
class OriginSite:
    host: str = "127.0.0.1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    hits: Counter = field(default_factory=Counter)

    def start(self) -> OriginSite:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            # Handlers still parked (a hanging route) end here, on a loop that still runs: left to the
            # collector they would close their writers on a closed loop, an unraisable error at some
            # later collection (during an unrelated ast.parse, CPython 3.11.7 then fails that parse).
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

        self._thread = threading.Thread(target=run, name="origin-site", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def last(self, path: str) -> Seen:
        return next(s for s in reversed(self.seen) if s.path == path)

    # ------------------------------------------------------------------------------------ server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(n) if n else b""
                path = target.split("?", 1)[0]
                self.seen.append(Seen(method, path, target, headers, body))
                self.hits[path] += 1
                if not await self._route(method, path, target, headers, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes,
                    headers: list[tuple[str, str]] = (), reason: str = "OK") -> bool:
        writer.write(self._head(status, reason, [*headers, ("content-length", str(len(body)))]) + body)
        await writer.drain()
        return True

    async def _route(self, method: str, path: str, target: str, headers: dict[str, str], body: bytes,
                     writer: asyncio.StreamWriter) -> bool:
        html = [("content-type", "text/html; charset=utf-8")]
        if path.startswith(("/page/", "/search/")):  # a JS page, indexable
            extra = [("set-cookie", "session=1"), ("x-custom-origin", "dropped"), ("etag", '"o1"'),
                     ("last-modified", "Wed, 01 Jan 2025 00:00:00 GMT"), ("cache-control", "max-age=60")]
            if "gzip" in headers.get("accept-encoding", ""):  # mtime 0: the same bytes in every second
                return await self._send(writer, 200, gzip.compress(JS_PAGE, mtime=0),
                                        html + extra + [("content-encoding", "gzip")])
            return await self._send(writer, 200, JS_PAGE, html + extra)
        if path.startswith("/slow/"):  # slow but within the deadlines
            await asyncio.sleep(0.6)
            return await self._send(writer, 200, JS_PAGE, html)
        if path.startswith("/negotiates/"):  # Markdown to an Accept naming it (Cloudflare's Markdown for Agents)
            await asyncio.sleep(0.5)  # long enough for concurrent misses to meet
            vary = [("vary", "accept")]
            if "text/markdown" in headers.get("accept", ""):
                return await self._send(writer, 200, b"# JS page\n", [("content-type", "text/markdown"), *vary])
            return await self._send(writer, 200, JS_PAGE, html + vary)
        if path == "/hang":  # never answers
            await asyncio.sleep(3600)
            return False
        if path == "/drip":  # a byte at a time, each within the read deadline, forever
            writer.write(self._head(200, "OK", html + [("content-length", "100000")]))
            for _ in range(100_000):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.5)
            return False
        if path == "/huge":  # chunked, without end (as good as 10 GB)
            writer.write(self._head(200, "OK", html + [("transfer-encoding", "chunked")]))
            chunk = b"x" * 65536
            frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            for _ in range(160_000):
                writer.write(frame)
                await writer.drain()
            return False
        if path == "/huge-digits":  # a length int() refuses (more than 4,300 digits)
            writer.write(self._head(200, "OK", html + [("content-length", "9" * 5000)]))
            await writer.drain()
            return False
        if path == "/huge-declared":
            writer.write(self._head(200, "OK", html + [("content-length", str(10 * 1024**3))]))
            await writer.drain()
            for _ in range(1000):
                writer.write(b"x" * 65536)
                await writer.drain()
            return False
        if path == "/cut":  # promises 100000 bytes, sends 1000, closes
            writer.write(self._head(200, "OK", html + [("content-length", "100000")]) + b"x" * 1000)
            await writer.drain()
            return False
        if path == "/big-head":
            return await self._send(writer, 200, JS_PAGE, html + [("x-filler", "y" * 80_000)])
        if path == "/error":
            return await self._send(writer, 500, b"origin broke", [("content-type", "text/plain"),
                                                                    ("retry-after", "30")], "Internal Server Error")
        if path == "/moved":
            return await self._send(writer, 301, b"", [("location", "/page/target"), ("set-cookie", "a=b")],
                                    "Moved Permanently")
        if path == "/future-modified":  # a Last-Modified from a clock far ahead
            return await self._send(writer, 200, JS_PAGE, html + [("last-modified", "Fri, 01 Jan 2100 00:00:00 GMT")])
        if path == "/noindex":
            return await self._send(writer, 200, JS_PAGE, html + [("x-robots-tag", "googlebot: noindex")])
        if path == "/data.json":
            return await self._send(writer, 200, b'{"a":1}', [("content-type", "application/json")])
        if path.startswith("/echo"):
            doc = {"method": method, "target": target, "headers": headers, "body": body.decode("latin-1")}
            return await self._send(writer, 200, json.dumps(doc).encode(), [("content-type", "application/json")])
        return await self._send(writer, 404, b"not here", [("content-type", "text/plain")], "Not Found")
