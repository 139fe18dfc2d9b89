"""The ingress decision for prefix and forwarded mode: bot request, not ours, or a bad request."""

from __future__ import annotations

from typing import Any

import pytest

from prerender_ray.config.loading import parse
from prerender_ray.serving.classify import (
    RESERVED_PATHS,
    BadBotRequest,
    BotRequest,
    Ingress,
    NotBot,
    is_reserved,
    reserved_prefixes,
    resolve,
)

CATALOG = {"match": "prefix", "path": "/product/", "queryParams": ["CN"]}
CART = {"match": "prefix", "path": "/cart", "mode": "passthrough"}
HOST = {"x-forwarded-host": "www.example.com"}


def prefix(**options: Any) -> Ingress:
    return Ingress(parse(options).config)


def forwarded(source: str = "path", routes: list | None = None, **options: Any) -> Ingress:
    ingress = {"mode": "forwarded", "deviceTypeSource": source, **options.pop("ingress", {}),
               "routes": [CATALOG, CART] if routes is None else routes}
    return Ingress(parse({"ingress": ingress, **options}).config)


def bot(decision: object) -> BotRequest:
    assert isinstance(decision, BotRequest), decision
    return decision


# ------------------------------------------------------------------------------------ prefix mode


def test_a_prefixed_absolute_url_is_a_bot_request_for_its_canonical_form() -> None:
    req = bot(prefix().resolve("GET", "/p/https://Example.com/a/", "page=2&utm_source=x", {}))
    assert req.url == "https://example.com/a?page=2"
    assert req.cache_key == "https://example.com/a?page=2|desktop"
    assert (req.device, req.route_class, req.route, req.allowlist, req.mode) == (
        "desktop", "prerender", None, ("page",), "prefix")
    assert req.host == "example.com" and req.cacheable


def test_the_bot_requests_own_query_is_the_targets_query() -> None:
    req = bot(prefix(cacheKey={"queryParams": ["*"]}).resolve("GET", "/p/https://x.com/a", "b=1&a=2", {}))
    assert req.url == "https://x.com/a?a=2&b=1"


def test_nothing_is_url_decoded_before_the_target_is_canonicalized() -> None:
    req = bot(prefix().resolve("GET", "/p/https://x.com/a%2Fb%7e", "", {}))
    assert req.url == "https://x.com/a%2Fb~"


def test_the_device_comes_from_the_configured_header_sanitized() -> None:
    ingress = prefix(ingress={"deviceTypeHeader": "X-Device"})
    assert bot(ingress.resolve("GET", "/p/https://x.com/", "", {"x-device": "MOBILE"})).device == "mobile"
    assert bot(ingress.resolve("GET", "/p/https://x.com/", "", {"x-device": "watch"})).device == "desktop"
    other_header = {"x-device-type": "tablet"}
    assert bot(ingress.resolve("GET", "/p/https://x.com/", "", other_header)).device == "desktop"


def test_prefix_mode_is_prerender_except_excludes_with_the_global_allowlist() -> None:
    ingress = prefix(ingress={"routes": [{"match": "prefix", "path": "/a", "queryParams": ["x"]}]})
    req = bot(ingress.resolve("GET", "/p/https://x.com/a/b", "x=1&page=2", {}))
    assert (req.route_class, req.url, req.route.path) == ("prerender", "https://x.com/a/b?page=2", "/a")
    req = bot(ingress.resolve("GET", "/p/https://x.com/search/shoes", "page=2&q=x", {}))
    assert (req.route_class, req.allowlist, req.url) == ("passthrough", ("page",), "https://x.com/search/shoes?page=2")


def test_prefix_mode_classifies_the_canonical_path() -> None:
    ingress = prefix(ingress={"excludePathPatterns": ["/private"]})
    assert bot(ingress.resolve("GET", "/p/https://x.com/%70rivate/x", "", {})).route_class == "passthrough"
    # The stripped slash still counts for a pattern that ends in one (docs/serving.md#route-classes, fixed).
    assert bot(prefix().resolve("GET", "/p/https://x.com/search/", "", {})).route_class == "passthrough"


def test_a_request_outside_the_prefix_is_not_a_bot_request() -> None:
    assert prefix().resolve("GET", "/other/https://x.com/", "", {}) == NotBot("not-prefixed")
    assert prefix().resolve("GET", "/p", "", {}) == NotBot("not-prefixed")


def test_a_custom_prefix_is_honoured() -> None:
    ingress = prefix(ingress={"botPathPrefix": "/render/"})
    assert bot(ingress.resolve("GET", "/render/https://x.com/a", "", {})).url == "https://x.com/a"
    assert isinstance(ingress.resolve("GET", "/p/https://x.com/a", "", {}), NotBot)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("", "empty"),
        ("example.com/x", "relative"),
        ("https%3A%2F%2Fx.com%2F", "relative"),
        ("ftp://x.com/a", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("https://x.com:99999/", "unparseable"),
        ("https://" + "a" * 9000, "too-long"),
        ("https://x.com/a\r\nSet-Cookie:%20x", "control-character"),
    ],
)
def test_a_bad_prefix_target_is_a_bad_request_with_a_reason_never_an_error(target: str, reason: str) -> None:
    decision = prefix().resolve("GET", "/p/" + target, "", {})
    assert isinstance(decision, BadBotRequest)
    assert decision.reason == reason and decision.message


def test_with_domains_set_a_prefix_target_on_another_host_is_refused() -> None:
    ingress = prefix(domains=["example.com", "bücher.de"])
    assert bot(ingress.resolve("GET", "/p/https://EXAMPLE.com/a", "", {})).host == "example.com"
    assert bot(ingress.resolve("GET", "/p/https://xn--bcher-kva.de/", "", {})).host == "xn--bcher-kva.de"
    refused = ingress.resolve("GET", "/p/https://evil.com/a", "", {})
    assert isinstance(refused, BadBotRequest) and refused.reason == "host-not-allowed"


def test_with_domains_set_a_prefix_target_on_another_port_is_refused_with_the_entry_to_add() -> None:
    ingress = prefix(domains=["example.com", "127.0.0.1:8080"])
    assert bot(ingress.resolve("GET", "/p/http://127.0.0.1:8080/a", "", {})).host == "127.0.0.1"
    assert bot(ingress.resolve("GET", "/p/https://example.com:443/a", "", {})).host == "example.com"
    for target, words in [("http://127.0.0.1:6379/", "127.0.0.1:6379 is not allowed by domains; add "
                                                     "'127.0.0.1:6379' or '127.0.0.1:*'"),
                          ("http://example.com:8080/", "example.com:8080 is not allowed"),
                          ("http://localhost:8080/", "localhost:8080 is not allowed"),
                          ("http://[::1]:8080/", "[::1]:8080 is not allowed")]:
        refused = ingress.resolve("POST", "/p/" + target, "", {})
        assert isinstance(refused, BadBotRequest) and refused.reason == "host-not-allowed"
        assert words in refused.message


def test_any_method_is_a_bot_request_but_only_get_and_head_are_cacheable() -> None:
    assert bot(prefix().resolve("HEAD", "/p/https://x.com/", "", {})).cacheable
    post = bot(prefix().resolve("POST", "/p/https://x.com/", "", {}))
    assert post.method == "POST" and not post.cacheable


# -------------------------------------------------------------------------------- reserved paths


@pytest.mark.parametrize("path", [*RESERVED_PATHS, "/prerender_admin/queue", "/render_queue/claim"])
def test_our_own_endpoints_are_never_bot_requests(path: str) -> None:
    assert is_reserved(path)
    everything = [{"match": "prefix", "path": "/"}]
    assert forwarded("header", everything).resolve("GET", path, "", HOST) == NotBot("reserved")
    assert prefix(ingress={"botPathPrefix": "/"}).resolve("GET", path, "", {}) == NotBot("reserved")


def test_a_path_that_only_starts_like_a_reserved_one_is_not_reserved() -> None:
    assert not is_reserved("/prerender_administration")
    assert not is_reserved("/metricsx")
    assert not is_reserved("/p/https://x.com/metrics")


def test_reserved_prefixes_are_the_static_part_of_each_route_path() -> None:
    got = reserved_prefixes(["/render_targets", "/sitemaps", "/prerender_admin/", "/prerender_admin/{rest:path}",
                             "/x/static/{name}", "/y/pre{id}/z", "/queue_control"], base=("/metrics",))
    assert got == ("/metrics", "/prerender_admin", "/queue_control", "/render_targets", "/sitemaps", "/x/static", "/y")
    assert reserved_prefixes(["/render_queue/claim", "/healthz"]) == tuple(sorted(RESERVED_PATHS))  # the base covers them
    for path in ("/render_targets", "/render_targets/x", "/sitemaps", "/y/anything"):
        assert is_reserved(path, got)
    assert not is_reserved("/render_targetsx", got) and not is_reserved("/x/staticx", got)
    with pytest.raises(ValueError, match="every path"):
        reserved_prefixes(["/{anything:path}"])


def test_the_reserved_prefixes_an_ingress_is_given_are_the_ones_it_keeps() -> None:
    everything = [{"match": "prefix", "path": "/"}]
    ingress = Ingress(parse({"ingress": {"mode": "forwarded", "deviceTypeSource": "header", "routes": everything},
                             "domains": ["www.example.com"]}).config,
                      reserved_prefixes(["/render_targets"]))
    assert ingress.resolve("PUT", "/render_targets", "", HOST) == NotBot("reserved")
    assert ingress.resolve("GET", "/healthz", "", HOST) == NotBot("reserved")  # the base stays
    assert isinstance(ingress.resolve("GET", "/render_targets_page", "", HOST), BotRequest)


# --------------------------------------------------------------------------------- forwarded mode


def test_path_mode_takes_the_device_from_the_first_segment() -> None:
    req = bot(forwarded().resolve("GET", "/mobile/product/prd-1107/lee.jsp", "", HOST))
    assert (req.device, req.url, req.route_class) == ("mobile", "https://www.example.com/product/prd-1107/lee.jsp",
                                                      "prerender")
    assert req.cache_key == "https://www.example.com/product/prd-1107/lee.jsp|mobile"
    assert req.mode == "forwarded"


def test_the_route_allowlist_keeps_its_params_and_drops_the_rest() -> None:
    req = bot(forwarded().resolve("GET", "/desktop/product/1", "utm_source=x&CN=3&page=2", HOST))
    assert (req.url, req.allowlist) == ("https://www.example.com/product/1?CN=3", ("CN",))


def test_the_forwarded_protocol_is_honoured_and_https_is_the_default() -> None:
    def scheme(ingress: Ingress, headers: dict[str, str]) -> str:
        return bot(ingress.resolve("GET", "/desktop/product/1", "", headers)).url.partition(":")[0]

    assert scheme(forwarded(), {**HOST, "x-forwarded-proto": "http"}) == "http"
    assert scheme(forwarded(), HOST) == "https"
    assert scheme(forwarded(), {**HOST, "x-forwarded-proto": "HTTP, https"}) == "http"
    assert scheme(forwarded(ingress={"defaultProtocol": "http"}), HOST) == "http"


def test_a_forwarded_protocol_other_than_http_falls_through() -> None:
    headers = {**HOST, "x-forwarded-proto": "javascript"}
    decision = forwarded().resolve("GET", "/desktop/product/1", "", headers)
    assert isinstance(decision, NotBot) and decision.reason == "bad-proto"


def test_path_mode_without_a_device_segment_is_not_a_bot_request() -> None:
    assert forwarded().resolve("GET", "/render_queue", "", HOST) == NotBot("reserved")
    assert forwarded().resolve("GET", "/product/1", "", HOST) == NotBot("no-device")
    assert forwarded().resolve("GET", "//mobile/product/1", "", HOST) == NotBot("no-device")


def test_a_device_only_path_is_the_root() -> None:
    req = bot(forwarded(routes=[{"match": "exact", "path": "/"}]).resolve("GET", "/tablet/", "", HOST))
    assert (req.device, req.url, req.route_class) == ("tablet", "https://www.example.com/", "prerender")


def test_a_device_prefixed_unmatched_path_is_served_unclassified_with_every_param() -> None:
    req = bot(forwarded().resolve("GET", "/DESKTOP/about", "b=2&a=1", HOST))
    assert (req.route_class, req.allowlist, req.url) == ("unclassified", ("*",), "https://www.example.com/about?a=1&b=2")


def test_header_mode_leaves_unclassified_paths_to_the_other_handlers() -> None:
    assert forwarded("header").resolve("GET", "/about", "", HOST) == NotBot("unclassified")


def test_header_mode_proxies_a_passthrough_path_with_the_header_device() -> None:
    req = bot(forwarded("header").resolve("GET", "/cart/1", "", {**HOST, "x-device-type": "tablet"}))
    assert (req.route_class, req.device) == ("passthrough", "tablet")


def test_header_mode_serves_a_route_with_the_device_from_the_header() -> None:
    req = bot(forwarded("header").resolve("GET", "/product/1", "", {**HOST, "x-device-type": "Mobile"}))
    assert (req.device, req.url) == ("mobile", "https://www.example.com/product/1")


def test_forwarded_mode_classifies_the_raw_path() -> None:
    ingress = forwarded("header", [{"match": "exact", "path": "/a/"}])
    assert bot(ingress.resolve("GET", "/a/", "", HOST)).url == "https://www.example.com/a"
    assert ingress.resolve("GET", "/a", "", HOST) == NotBot("unclassified")


def test_the_first_forwarded_host_is_used_trimmed() -> None:
    headers = {"x-forwarded-host": " Shop.Example.com:8443 , b"}
    req = bot(forwarded().resolve("GET", "/mobile/product/1", "", headers))
    assert req.url == "https://shop.example.com:8443/product/1"


def test_a_custom_forwarded_host_header_is_read() -> None:
    ingress = forwarded(ingress={"forwardedHostHeader": "X-Original-Host"})
    assert bot(ingress.resolve("GET", "/mobile/product/1", "", {"x-original-host": "a.com"})).host == "a.com"


@pytest.mark.parametrize(
    "host",
    [None, "", "evil.com/inject", "a@b.com", "https://x.com", "[::1]", "ex_ample.com", "bücher.de", "a b.com",
     "x.com\r\nX-Injected: 1", "x.com:", "x.com:port", "x.com\x00"],
)
def test_a_missing_or_suspicious_forwarded_host_falls_through(host: str | None) -> None:
    headers = {} if host is None else {"x-forwarded-host": host}
    decision = forwarded().resolve("GET", "/mobile/product/1", "", headers)
    assert isinstance(decision, NotBot) and decision.reason == "bad-host"


def test_an_out_of_range_port_passes_the_guard_but_not_the_parser() -> None:
    decision = forwarded().resolve("GET", "/mobile/product/1", "", {"x-forwarded-host": "x.com:99999"})
    assert isinstance(decision, NotBot) and decision.reason == "bad-url"


def test_the_guard_accepts_what_the_reference_accepts() -> None:
    for host in ("example.com.", "a..b", "x.com:8080", "127.0.0.1"):
        decision = forwarded().resolve("GET", "/mobile/product/1", "", {"x-forwarded-host": host})
        assert isinstance(decision, BotRequest)


def test_a_forwarded_host_outside_the_configured_domains_falls_through() -> None:
    ingress = forwarded(domains=["www.example.com"])
    assert isinstance(ingress.resolve("GET", "/mobile/product/1", "", HOST), BotRequest)
    decision = ingress.resolve("GET", "/mobile/product/1", "", {"x-forwarded-host": "other.com"})
    assert isinstance(decision, NotBot) and decision.reason == "host-not-allowed"
    on_port = ingress.resolve("GET", "/mobile/product/1", "", {"x-forwarded-host": "www.example.com:8443"})
    assert isinstance(on_port, NotBot) and on_port.reason == "host-not-allowed"
    assert "www.example.com:8443 is not allowed by domains" in on_port.detail


def test_a_bad_path_rebuilds_into_a_bad_url_and_falls_through() -> None:
    decision = forwarded("header", [{"match": "contains", "path": "x"}]).resolve("GET", "/x\nb", "", HOST)
    assert isinstance(decision, NotBot) and decision.reason == "bad-url"


def test_the_same_page_spelled_two_ways_gets_one_key() -> None:
    ingress = forwarded()
    a = bot(ingress.resolve("GET", "/mobile/product/%70rd-1/", "CN=1&utm_source=x", HOST))
    other_host = {"x-forwarded-host": "WWW.EXAMPLE.COM:443"}
    b = bot(ingress.resolve("GET", "/Mobile/product/prd-1", "CN=1", other_host))
    assert a.cache_key == b.cache_key == "https://www.example.com/product/prd-1?CN=1|mobile"


# -------------------------------------------------------------------------------------- resolve()


def test_resolve_accepts_a_config_or_a_compiled_ingress() -> None:
    cfg = parse({}).config
    path = "/p/https://x.com/"
    assert resolve("GET", path, "", {}, cfg) == Ingress(cfg).resolve("GET", path, "", {})
    assert isinstance(resolve("GET", "/p/https://x.com/", "", {}, Ingress(cfg)), BotRequest)


def test_a_device_name_holding_the_key_delimiter_is_refused_at_build_time() -> None:
    with pytest.raises(ValueError, match="delimiter"):
        prefix(deviceTypes={"supported": ["desktop", "tv|hd"], "default": ["desktop"]})
