"""The discovery budget: how many new targets bot misses may make per site (``bots.discovery``). Pure.

A bot miss the origin answers with an indexable page makes a target (docs/serving.md#discovery). Bot
traffic is anyone's to send, so what it can add to the queue is bounded twice per site (the URL's
host, without the port):

- a **rate**, a token bucket per site in each ingress replica (``RateBudget``): ``perMinute`` per node,
  split over the node's replicas, a minute's worth as the burst. Cheap, refused before any actor call.
  Per replica is enough for a rate: the node's total is what the config says, the cluster's is that
  times the nodes that bots reach;
- a **ceiling** of discovered targets that have had no render result yet (``Unrendered``), held by the
  owner keeper of each URL, which sees every discovery of its slice whichever replica or node the
  bot asked. The configured ceiling is cluster-wide: each owner enforces its share
  (``share_of``: ceil(max / nodes)), and URLs spread evenly over owners, so the sum stays within
  max + nodes - 1.

A URL that has a target already (listed by a sitemap, put, discovered before) costs nothing: callers
look before they take. The counts live in memory: a keeper restart starts its ceiling afresh (the
rate still holds), and a URL whose rows left this keeper (handed over, deleted) stops counting at the
next sweep.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prerender_ray.identity.urls import url_host

# prerender_discovery_refused_total{reason}
RATE, CEILING, SITES, BUSY = "rate", "ceiling", "sites", "busy"
FAILED_CLAIM, UNVERIFIED_CLAIM = "failed-claim", "unverified-claim"
REASONS = (RATE, CEILING, SITES, BUSY, FAILED_CLAIM, UNVERIFIED_CLAIM)
MAX_SITES = 10_000  # sites tracked at once (buckets per replica, counts per keeper)
MAX_UNRENDERED_HELD = 200_000  # URLs one keeper counts at once, whatever the sites
SWEEP_EVERY_MS = 1_000  # a site at its ceiling is re-examined at most this often


def site_of(canonical_url: str) -> str:
    """The site a URL's discoveries are counted against: its host (every port of it alike)."""
    return url_host(canonical_url).lower()


def share_of(max_unrendered: int, nodes: int) -> int:
    """One owner's part of the cluster-wide ceiling."""
    return math.ceil(max_unrendered / max(1, nodes))


class RateBudget:
    """A token bucket per site: ``per_minute`` tokens a minute, at most ``per_minute`` held (at least
    one, when any). ``take`` answers None (granted) or the refusal reason."""

    def __init__(self, per_minute: float, *, max_sites: int = MAX_SITES):
        self.per_ms = per_minute / 60_000
        self.burst = max(1.0, per_minute) if per_minute > 0 else 0.0
        self.max_sites = max_sites
        self._buckets: dict[str, tuple[float, float]] = {}  # site -> (tokens, at ms)

    def take(self, site: str, now_ms: float) -> str | None:
        if self.burst <= 0:
            return RATE
        held = self._buckets.get(site)
        if held is None:
            if len(self._buckets) >= self.max_sites and not self._forget_full(now_ms):
                return SITES
            tokens = self.burst
        else:
            tokens = min(self.burst, held[0] + max(0.0, now_ms - held[1]) * self.per_ms)
        if tokens < 1.0:
            self._buckets[site] = (tokens, now_ms)
            return RATE
        self._buckets[site] = (tokens - 1.0, now_ms)
        return None

    def _forget_full(self, now_ms: float) -> bool:
        """Drop the buckets that have refilled (a fresh one is the same); True when room was made."""
        burst, per_ms = self.burst, self.per_ms
        full = [s for s, (t, at) in self._buckets.items() if t + max(0.0, now_ms - at) * per_ms >= burst]
        for s in full:
            del self._buckets[s]
        return len(self._buckets) < self.max_sites

    def __len__(self) -> int:
        return len(self._buckets)


class Unrendered:
    """Discovered targets per site that have had no render result yet, for the URLs one keeper owns.

    ``admit`` reserves a place before the target is written (concurrent discoveries of one site
    cannot overshoot), ``release`` gives it back (nothing was written, or a result came, or the
    URL's rows left). ``sweep`` drops URLs the keeper no longer holds rows for."""

    def __init__(self, *, max_sites: int = MAX_SITES, max_held: int = MAX_UNRENDERED_HELD):
        self.max_sites = max_sites
        self.max_held = max_held
        self._sites: dict[str, dict[str, int]] = {}  # site -> {url: admitted at, ms}
        self._held = 0
        self._swept: dict[str, int] = {}  # site -> when it was last swept
        self.refused = dict.fromkeys((CEILING, SITES), 0)

    def admit(self, url: str, share: int, now_ms: int) -> str | None:
        """Reserve ``url``'s place under ``share`` for its site: None, or the refusal reason."""
        site = site_of(url)
        urls = self._sites.get(site)
        if urls is not None and url in urls:
            return None
        if share <= 0 or (urls is not None and len(urls) >= share):
            return CEILING
        if self._held >= self.max_held or (urls is None and len(self._sites) >= self.max_sites):
            return SITES
        if urls is None:
            urls = self._sites[site] = {}
        urls[url] = now_ms
        self._held += 1
        return None

    def refuse(self, reason: str) -> None:
        """Count a refusal ``admit`` answered and the caller stood by (the URL was not known)."""
        self.refused[reason] += 1

    def release(self, url: str) -> bool:
        site = site_of(url)
        urls = self._sites.get(site)
        if urls is None or urls.pop(url, None) is None:
            return False
        self._held -= 1
        if not urls:
            del self._sites[site]
            self._swept.pop(site, None)
        return True

    def sweep_due(self, site: str, now_ms: int) -> bool:
        """Whether ``site`` (at its ceiling) may be swept now; marks it swept."""
        if now_ms - self._swept.get(site, -SWEEP_EVERY_MS) < SWEEP_EVERY_MS:
            return False
        self._swept[site] = now_ms
        return True

    def sweep(self, site: str, holds: Callable[[str], bool]) -> int:
        """Release every URL of ``site`` for which ``holds`` (does this keeper still schedule it?) is false."""
        gone = [u for u in self._sites.get(site, ()) if not holds(u)]
        for u in gone:
            self.release(u)
        return len(gone)

    def __contains__(self, url: str) -> bool:
        return url in self._sites.get(site_of(url), ())

    def count(self, site: str) -> int:
        return len(self._sites.get(site, ()))

    def __len__(self) -> int:
        return self._held

    def report(self, share: int, top: int = 50) -> dict:
        """The queue-state ``discovery`` field: the share, the sites counted (most first) and the
        ones whose budget is spent (no discovery until results come)."""
        counts = sorted(((len(u), s) for s, u in self._sites.items()), reverse=True)
        return {"unrenderedPerSite": share, "unrendered": self._held,
                "sites": {s: n for n, s in counts[:top]}, "sitesTruncated": len(counts) > top,
                "spent": sorted(s for n, s in counts if n >= share)[:top], "refused": dict(self.refused)}
