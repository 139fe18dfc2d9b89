"""The floor of a spread hit in Python: what the least Python costs a hit over the page log, for
``bench_serving``'s context rows beside row (e).

Run by ``bench_serving`` (``python bench/serving_floor.py PORT DATA_DIR CONFIG_JSON MODE``): a server
on uvloop and httptools, no uvicorn and no app, that reads the deployment's page log as a replica
does (``PageLogReader``: the whole index in memory). Per request, ``MODE``:

- ``key``: parse; the cache key from the raw path (``/p/<url>`` -> ``<url>|desktop``); one dict
  look-up, one checksummed ``pread``; one write of a fixed header block and the record read.
- ``decision``: the same, with the cache key from the ingress decision for the URL
  (``Ingress.resolve``, as a replica makes it for a URL it has not seen: canonicalization, the
  domain check, the device, the route) instead of from the raw path.

Nothing else: no bot identity (the decision memo keeps it per crawler), no policy, no counts, no
freshness, no Date. So the gap between these rows and row (e) is what the bot path's own work per new
URL costs, and the gap between them and the ceiling is what the page log costs. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httptools  # noqa: E402
import uvloop  # noqa: E402

from prerender_ray.compiled import CompiledConfig  # noqa: E402
from prerender_ray.config.model import Config  # noqa: E402
from prerender_ray.serving.classify import BotRequest  # noqa: E402
from prerender_ray.storage.pagelog import PageLogReader, key_hash  # noqa: E402
from prerender_ray.storage.rocks import pagelog_path  # noqa: E402

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-encoding: gzip\r\n"
        b"etag: \"bench-v1\"\r\nx-harper-rendered: 1\r\nage: 3\r\nvary: Accept-Encoding\r\ncontent-length: ")
MISSING = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
PREFIX = b"/p/"


class Floor(asyncio.Protocol):
    def __init__(self, reader: PageLogReader, ingress: Any) -> None:
        self.reader = reader
        self.ingress = ingress  # None: the key from the raw path
        self.transport: Any = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.parser = httptools.HttpRequestParser(self)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.ingress is not None:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_message_complete(self) -> None:
        key = self._key()
        hit = None if key is None else self.reader.get(key_hash(key))
        if hit is None:
            self.transport.write(MISSING)
        else:
            self.transport.writelines([HEAD, str(len(hit.data)).encode(), b"\r\n\r\n", hit.data])
        if not self.parser.should_keep_alive():
            self.transport.close()

    def _key(self) -> str | None:
        if self.ingress is None:
            return self.url[len(PREFIX):].decode("latin-1") + "|desktop" if self.url.startswith(PREFIX) else None
        parsed = httptools.parse_url(self.url)
        query = parsed.query.decode("latin-1") if parsed.query else ""
        decision = self.ingress.resolve("GET", parsed.path.decode("latin-1"), query, self.headers)
        return decision.cache_key if type(decision) is BotRequest else None


def main() -> None:
    port, data_dir, config_json, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    reader = PageLogReader(pagelog_path(data_dir, "node-a"))
    ingress = CompiledConfig(Config.model_validate(json.loads(config_json))).ingress() if mode == "decision" else None

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: Floor(reader, ingress), "127.0.0.1", port,
                                                                 backlog=2048)
        await server.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
