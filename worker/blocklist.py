"""Requests a render never needs: analytics, tag managers, ads, consent and chat widgets.

Blocked in Chromium (failed as blocked by client) before they leave the browser: a render is faster,
and the site's analytics never count the renderer as a visitor. Matched by host, a listed host and
its subdomains; Chromium pauses only requests to these hosts (CDP ``Fetch`` patterns), so the list
costs nothing on other requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from prerender_ray.config.base import clean_host

# Hosts of third-party scripts that never change what a page's content is.
DEFAULT_BLOCKED_HOSTS = (
    # analytics and tag managers
    "google-analytics.com", "analytics.google.com", "googletagmanager.com", "googletagservices.com",
    "stats.g.doubleclick.net", "cdn.segment.com", "api.segment.io", "cdn.mxpnl.com", "api-js.mixpanel.com",
    "cdn.amplitude.com", "api2.amplitude.com", "static.hotjar.com", "script.hotjar.com", "clarity.ms",
    "fullstory.com", "edge.fullstory.com", "js-agent.newrelic.com", "bam.nr-data.net", "plausible.io",
    "static.cloudflareinsights.com", "mc.yandex.ru", "analytics.tiktok.com", "cdn.heapanalytics.com",
    "browser.sentry-cdn.com",
    # ads and ad measurement
    "doubleclick.net", "googlesyndication.com", "googleadservices.com", "adservice.google.com",
    "connect.facebook.net", "bat.bing.com", "snap.licdn.com", "static.ads-twitter.com", "ads.linkedin.com",
    "amazon-adsystem.com", "criteo.com", "taboola.com", "outbrain.com", "quantserve.com",
    # consent managers
    "cdn.cookielaw.org", "consent.cookiebot.com", "consentcdn.cookiebot.com", "cmp.osano.com",
    "app.usercentrics.eu", "cdn.privacy-mgmt.com", "quantcast.mgr.consensu.org",
    # chat and support widgets
    "widget.intercom.io", "js.intercomcdn.com", "js.driftt.com", "client.crisp.chat", "embed.tawk.to",
    "static.zdassets.com", "js.hs-scripts.com", "js.usemessages.com", "wchat.freshchat.com",
)
MAX_HOSTS = 1000


class Blocklist:
    def __init__(self, hosts: Iterable[str], *, extra: Iterable[str] | None = None, defaults: bool = False):
        """``hosts``: the whole list. ``extra`` and ``defaults``: what it was made of (``of``), which
        ``for_job`` starts from; by default, the hosts themselves and no maintained list."""
        cleaned = []
        for h in hosts:
            if not h.strip().strip("."):
                continue
            h = clean_host(h)
            if h not in cleaned:
                cleaned.append(h)
        if len(cleaned) > MAX_HOSTS:
            raise ValueError(f"a blocklist holds at most {MAX_HOSTS} hosts, not {len(cleaned)}")
        self.hosts = tuple(cleaned)
        self._set = frozenset(cleaned)
        self.extra = self.hosts if extra is None else tuple(extra)
        self.defaults = defaults

    @classmethod
    def of(cls, extra: Iterable[str] = (), *, defaults: bool = True) -> Blocklist:
        extra = tuple(extra)
        return cls([*(DEFAULT_BLOCKED_HOSTS if defaults else ()), *extra], extra=extra, defaults=defaults)

    def for_job(self, hosts: Iterable[str], *, defaults: bool) -> Blocklist:
        """This list with a route's hosts added; ``defaults=False`` drops the maintained list (the
        worker's own --block-host hosts stay)."""
        return Blocklist.of([*self.extra, *hosts], defaults=self.defaults and defaults)

    def patterns(self) -> list[dict[str, str]]:
        """CDP ``Fetch.enable`` patterns pausing requests to these hosts (any scheme, subdomain and
        port: a pattern matches the URL's text, where a port follows the host)."""
        out = []
        for h in self.hosts:
            out += [{"urlPattern": f"*://{sub}{h}{port}/*"} for sub in ("", "*.") for port in ("", ":*")]
        return out

    def blocks(self, url: str) -> bool:
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:
            return False
        while host:
            if host in self._set:
                return True
            _, _, host = host.partition(".")
        return False
