"""The URL explainer's pure part (docs/sitemaps.md#url-explainer): for one URL and device, what the ingress
would do with it, read from the config alone: the route it matches, the query allowlist, the
canonical URL and cache key, the key it would have under the global allowlist, and whether it is
eligible for prerendering at all. The admin route adds the live rows (target, schedule, page) and
the residency; ``describe_*`` shape those rows the same way everywhere.
"""

from __future__ import annotations

from typing import Any

from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.routes import Router
from prerender_ray.identity.urls import url_host, url_path, whatwg_path
from prerender_ray.queue.guard import MEASURE_HEADER, describe_refusal, parse_measure
from prerender_ray.serving.origin_policy import compiled
from prerender_ray.storage.pages import PageMeta, freshness
from prerender_ray.storage.registry import Target


class Explainer:
    """The config-only part of the explainer; build once per config."""

    def __init__(self, cfg: Config, *, router: Router | None = None, keys: KeyFormat | None = None):
        self.cfg = cfg
        self.mode = cfg.ingress.mode
        self.router = router or Router(cfg)  # shared when built by CompiledConfig
        self.keys = keys or KeyFormat.from_config(cfg)
        self.supported = tuple(d.lower() for d in cfg.device_types.supported)
        self.global_allowlist = tuple(cfg.cache_key.query_params)
        self.domains = compiled(tuple(cfg.domains))
        self._route_index = {id(r): i for i, r in enumerate(
            r for r in self.router.routes if r.source == "ingress.routes")}

    def device(self, value: object) -> tuple[str, bool]:
        """(device, fellBack): lower-cased when supported; anything else explicit falls back to the
        first supported type and says so (``Mobile`` is normalization, not a fallback)."""
        if isinstance(value, str) and value.lower() in self.supported:
            return value.lower(), False
        return self.supported[0], value is not None and value != ""

    def explain(self, url: str, device: object = None) -> dict[str, Any]:
        """Raises ``UrlError`` for a URL that is not an absolute http(s) URL."""
        dev, fell_back = self.device(device)
        global_url = self.keys.canonicalize(url, self.global_allowlist)
        if self.mode == "prefix":
            verdict = self.router.classify(url_path(global_url))
            canonical = global_url
        else:
            verdict = self.router.classify(whatwg_path(url))
            canonical = self.keys.canonicalize(url, verdict.allowlist)
        route = verdict.route
        if self.mode == "prefix":
            source = "cacheKey.queryParams"
        elif verdict.route_class == "prerender" and route is not None:
            source = f"ingress.routes[{self._route_index.get(id(route), '?')}].queryParams"
        else:
            source = f"{verdict.route_class} - all params kept"
        host = url_host(canonical)
        key = self.keys.key(canonical, dev)
        global_key = self.keys.key(global_url, dev)
        excluded = route.path if route is not None and route.source == "excludePathPatterns" else None
        return {
            "input": {"url": url, "deviceType": device if isinstance(device, str) else None},
            "resolved": {"deviceType": dev, "deviceTypeFellBack": fell_back, "hostname": host,
                         "canonicalUrl": canonical, "cacheKey": key},
            "ingress": {"mode": self.mode, "deviceTypeSource": self.cfg.ingress.device_type_source,
                        "routeClass": verdict.route_class,
                        "route": route.as_dict() if route is not None else None},
            "allowlist": {"used": list(verdict.allowlist), "source": source},
            "underGlobalAllowlist": {"allowlist": list(self.global_allowlist), "canonicalUrl": global_url,
                                     "cacheKey": global_key, "differs": global_key != key},
            "eligibility": {"prerendered": verdict.route_class == "prerender", "excludedByPattern": excluded,
                            "domainAllowed": self.domains.url_allowed(canonical),
                            "domains": [e.text for e in self.domains.entries]},
        }


# ------------------------------------------------------------------------------------- row shapes


def describe_page(meta: PageMeta | None, now: int, swr_ttl: int) -> dict | None:
    """A stored page's metadata (never its content) with the serve path's freshness verdict."""
    if meta is None:
        return None
    fresh = freshness(meta, now, swr_ttl)
    measure, suspect = parse_measure(meta.headers.get(MEASURE_HEADER))
    return {"cacheKey": meta.cache_key, "statusCode": meta.status_code, "lastCached": meta.last_cached,
            "expiresAt": meta.expires_at, "isIndexable": meta.is_indexable, "fresh": fresh == "hit",
            "inStaleWhileRevalidate": fresh == "swr", "servable": fresh is not None, "swrTtl": swr_ttl,
            "contentEncoding": meta.content_encoding, "location": meta.headers.get("location"),
            "measure": measure.as_json() if measure is not None else None, "suspect": suspect}


def describe_refused(target: Target | None, key: str) -> dict | None:
    """The last render of the URL the guard refused over the stored page (with both versions' sizes).
    The target keeps one record for all its devices (they render in one cycle), so it may be another
    device's: ``cacheKey`` names it and ``otherDevice`` says so."""
    found = describe_refusal(target.refused) if target is not None else None
    return None if found is None else {**found, "otherDevice": found["cacheKey"] != key}


def describe_suppression(target: Target | None, cfg: Config) -> dict | None:
    if target is None or not target.suppressed:
        return None
    s = cfg.render.suppression
    gone = target.suppressed_reason == "http-gone"
    return {"reason": target.suppressed_reason, "suppressedAt": target.suppressed_at,
            "strikes": target.strikes, "maxStrikes": s.gone.max_strikes if gone else s.max_strikes,
            "recheckInterval": s.gone.recheck_interval if gone else s.recheck_interval}


def verdict(*, prerendered: bool, target: Target | None, schedule: dict | None, page: dict | None,
            reliable: bool) -> dict:
    suppressed = target is not None and target.suppressed
    cached = prerendered and page is not None and page["servable"]
    return {"reliable": reliable,
            "wouldServe": "cache" if cached else "origin-or-render",
            "servedStatus": page["statusCode"] if cached and page is not None else None,
            "scheduled": schedule is not None, "recurring": target is not None and not suppressed,
            "suppressed": suppressed}
