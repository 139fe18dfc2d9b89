"""IndexNow (https://www.indexnow.org/documentation), pure: the key file a site serves, the queue of
changed URLs waiting for a submission, the rate limit and retry schedule of one endpoint, and the
submission body. The sending side (HTTP, the loop) is ``actors/keeper/indexnow.py``.

Only URLs of the configured ``indexNow.hosts`` are queued; a batch holds one origin's URLs (the
protocol's ``host``), at most ``batchSize`` (10,000). The queue is bounded: past ``maxQueued`` the
oldest URL is dropped, so a long outage of an endpoint costs memory of a fixed size.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prerender_ray.identity.urls import UrlError, url_parts
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.origin_policy import origin_of, split_authority

CONTENT_TYPE = "text/plain; charset=utf-8"
_FORWARDED_HOST = re.compile(r"[A-Za-z0-9.\-]+(?::[0-9]+)?", re.ASCII)


@dataclass(frozen=True, slots=True)
class KeyFile:
    """``/<key>.txt`` on each configured host: the proof, for a search engine, that the key's owner
    controls the site. Any other path (another key's included) goes its usual way."""

    key: str
    hosts: frozenset[str]

    @classmethod
    def of(cls, key: str, hosts: Iterable[str]) -> KeyFile:
        return cls(key, frozenset(hosts))

    @property
    def path(self) -> str:
        return f"/{self.key}.txt"

    def asked(self, mode: str, prefix: str, host_header: str, path: str, query: str,
              headers: Mapping[str, str]) -> bool:
        """Whether a request (``path`` raw, as sent) asks for the key file of a configured host."""
        if query or not path.endswith(self.path):
            return False
        if mode == "prefix":
            if not path.startswith(prefix):
                return False
            try:
                scheme, authority, url_path, url_query = url_parts(path[len(prefix):])
            except UrlError:
                return False
            if url_path != self.path or url_query:
                return False
            host = split_authority(scheme, authority)[0]
        else:
            if path != self.path:
                return False
            raw = (headers.get(host_header) or "").split(",", 1)[0].strip()
            if _FORWARDED_HOST.fullmatch(raw) is None:
                return False
            host = raw.rpartition(":")[0] if ":" in raw else raw
        return host.lower() in self.hosts

    def reply(self, method: str) -> Reply:
        body = self.key.encode()
        return Reply(200, {"content-type": CONTENT_TYPE, "content-length": str(len(body)),
                           "cache-control": "max-age=3600"}, b"" if method == "HEAD" else body)


def host_of(url: str, hosts: frozenset[str]) -> str | None:
    """The origin (``scheme://authority``) of ``url`` when its host is one of ``hosts``, else None."""
    found = origin_of(url)
    if found is None or found[1] not in hosts:
        return None
    scheme, authority = url_parts(url)[:2]
    return f"{scheme}://{authority}"


def submission(origin: str, key: str, urls: list[str]) -> bytes:
    """The JSON body of one submission: ``{host, key, keyLocation, urlList}``."""
    scheme, authority = url_parts(origin + "/")[:2]
    host = split_authority(scheme, authority)[0]
    return json.dumps({"host": host, "key": key, "keyLocation": f"{origin}/{key}.txt", "urlList": urls},
                      separators=(",", ":")).encode()


class Pending:
    """Changed URLs waiting for a submission, oldest first, each once; bounded (the oldest dropped)."""

    def __init__(self, max_queued: int):
        self.max_queued = max_queued
        self._urls: OrderedDict[str, str] = OrderedDict()  # url -> origin
        self._per_origin: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._urls)

    def add(self, url: str, origin: str) -> int:
        """Queue ``url``; returns how many older URLs were dropped to make room (0 or 1)."""
        if url in self._urls:
            self._urls.move_to_end(url)  # changed again: one submission says so
            return 0
        dropped = 0
        while len(self._urls) >= self.max_queued:
            _, old = self._urls.popitem(last=False)
            self._count(old, -1)
            dropped += 1
        self._urls[url] = origin
        self._count(origin, 1)
        return dropped

    def full(self, cap: int) -> bool:
        """Whether some origin has a whole batch waiting."""
        return any(n >= cap for n in self._per_origin.values())

    def take(self, cap: int) -> tuple[str, list[str]] | None:
        """The next batch: up to ``cap`` URLs of the origin whose URL waited longest, oldest first."""
        if not self._urls:
            return None
        origin = next(iter(self._urls.values()))
        urls = []
        for url, o in self._urls.items():
            if o == origin:
                urls.append(url)
                if len(urls) == cap:
                    break
        for url in urls:
            del self._urls[url]
        self._count(origin, -len(urls))
        return origin, urls

    def _count(self, origin: str, n: int) -> None:
        left = self._per_origin.get(origin, 0) + n
        if left > 0:
            self._per_origin[origin] = left
        else:
            self._per_origin.pop(origin, None)


class RateLimit:
    """At most one request per ``min_interval_s`` to one endpoint (monotonic seconds)."""

    def __init__(self, min_interval_s: float):
        self.min_interval_s = min_interval_s
        self._last: float | None = None

    def wait_s(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return max(0.0, self._last + self.min_interval_s - now)

    def spent(self, now: float) -> None:
        self._last = now


def backoff_s(base_s: float, attempt: int) -> float:
    """Wait before try ``attempt + 1`` (``attempt`` >= 1 tries made): doubled each time, at most 64 x."""
    return base_s * 2 ** min(attempt - 1, 6)


def retryable(status: int) -> bool:
    """An answer worth another try: too many requests, or the endpoint's own trouble."""
    return status == 429 or status >= 500
