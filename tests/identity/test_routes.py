"""Route classes: compiling the route list, first-match classification in both modes, allowlists
and render intervals."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.config.loading import parse
from prerender_ray.identity.routes import Router, compile_route_list

PRODUCT = {"match": "prefix", "path": "/product/prd-", "queryParams": ["CN"]}
CART = {"match": "prefix", "path": "/cart", "mode": "passthrough"}


def router(**ingress: Any) -> Router:
    return Router(parse({"ingress": {"mode": "forwarded", "excludePathPatterns": [], **ingress}}).config)


def prefix_router(**options: Any) -> Router:
    return Router(parse({"ingress": {"mode": "prefix", **options.pop("ingress", {})}, **options}).config)


# ------------------------------------------------------------------------------------- compiling


def test_exact_and_prefix_routes_match_as_written_and_the_first_match_wins() -> None:
    r = router(routes=[{"match": "exact", "path": "/"}, PRODUCT,
                       {"match": "prefix", "path": "/product/", "mode": "passthrough"}])
    assert r.classify("/").route.match == "exact"
    assert r.classify("/?x").route_class == "unclassified"  # exact is string equality
    assert r.classify("/product/prd-1/x").route.path == "/product/prd-"
    assert r.classify("/product/other").route_class == "passthrough"
    assert r.classify("/render_queue").route_class == "unclassified"


def test_matching_does_no_normalization_and_no_case_folding() -> None:
    r = router(routes=[PRODUCT])
    assert r.classify("/Product/prd-1").route_class == "unclassified"
    assert r.classify("/product/prd%2D1").route_class == "unclassified"


def test_a_contains_route_matches_anywhere_in_the_path() -> None:
    r = router(routes=[{"match": "contains", "path": "print"}])
    assert r.classify("/a/print/b").route_class == "prerender"


def test_malformed_routes_are_dropped_one_by_one_with_a_warning_naming_each() -> None:
    compiled = compile_route_list(
        [
            {"match": "regex", "path": "/a"},
            {"match": "exact", "path": "no-slash"},
            {"match": "prefix", "path": "/b", "mode": "cache"},
            {"match": "prefix"},
            "not a mapping",
            {"match": "prefix", "path": "/ok"},
        ],
        [],
    )
    assert [r.path for r in compiled.routes] == ["/ok"]
    assert compiled.dropped == 5
    assert compiled.prerender_count == 1
    text = "\n".join(compiled.warnings)
    for named in ("ingress.routes[0]", "ingress.routes[1]", "ingress.routes[2]", "ingress.routes[3]",
                  "ingress.routes[4]", "ignored 5 invalid route(s)"):
        assert named in text


def test_a_route_defaults_to_prerender_with_its_own_allowlist_and_source() -> None:
    (route,) = compile_route_list([PRODUCT], []).routes
    assert (route.mode, route.query_params, route.source) == ("prerender", ("CN",), "ingress.routes")
    assert route.scope == "route:prefix:/product/prd-"


def test_a_prerender_route_without_query_params_drops_the_whole_query() -> None:
    (route,) = compile_route_list([{"match": "prefix", "path": "/a"}], []).routes
    assert route.query_params == ()


def test_an_unmatched_forwarded_path_is_unclassified_with_every_param_and_no_route() -> None:
    verdict = router(routes=[PRODUCT]).classify("/elsewhere")
    assert (verdict.route_class, verdict.allowlist, verdict.route) == ("unclassified", ("*",), None)


def test_a_passthrough_route_keeps_every_param_whatever_it_lists() -> None:
    compiled = compile_route_list([{"match": "prefix", "path": "/cart", "mode": "passthrough",
                                    "queryParams": ["a"], "renderInterval": 5}], [])
    (route,) = compiled.routes
    assert route.query_params == ("*",) and route.render_interval is None
    assert any("queryParams ignored" in w for w in compiled.warnings)
    assert any("renderInterval ignored" in w for w in compiled.warnings)


def test_a_passthrough_carve_out_listed_first_beats_a_broader_prerender_prefix() -> None:
    r = router(routes=[{"match": "prefix", "path": "/product/cart", "mode": "passthrough"},
                       {"match": "prefix", "path": "/product/"}])
    assert r.classify("/product/cart/1").route_class == "passthrough"
    assert r.classify("/product/1").route_class == "prerender"


def test_exclude_patterns_come_first_as_contains_passthrough_entries() -> None:
    r = router(routes=[{"match": "prefix", "path": "/catalog/"}], excludePathPatterns=["/search/"])
    verdict = r.classify("/catalog/search/x")
    assert verdict.route_class == "passthrough"
    assert (verdict.route.match, verdict.route.source) == ("contains", "excludePathPatterns")


def test_junk_exclude_patterns_are_tolerated_and_a_query_pattern_is_warned_about() -> None:
    compiled = compile_route_list([], ["", None, 42, {}, "/search/", "?q="])
    assert [r.path for r in compiled.routes] == ["/search/", "?q="]
    assert any("can never match" in w for w in compiled.warnings)


def test_a_routes_value_that_is_not_a_list_compiles_to_no_routes() -> None:
    compiled = compile_route_list({"match": "prefix"}, [])
    assert compiled.routes == ()
    assert any("not a list" in w for w in compiled.warnings)


def test_a_forwarded_config_with_no_prerender_route_is_reported_as_risky() -> None:
    loaded = parse({"ingress": {"mode": "forwarded", "routes": [CART]}})
    assert any(f.key == "ingress.routes" for f in loaded.findings)


# ----------------------------------------------------------------------------------- prefix mode


def test_prefix_mode_prerenders_everything_but_excludes_with_the_global_allowlist() -> None:
    r = prefix_router(ingress={"routes": [{"match": "prefix", "path": "/p/", "queryParams": ["x"]}]},
                      cacheKey={"queryParams": ["page", "q"]})
    for path in ("/", "/anything", "/p/1"):
        verdict = r.classify(path)
        assert (verdict.route_class, verdict.allowlist) == ("prerender", ("page", "q"))
    assert (r.classify("/search/shoes").route_class, r.classify("/search/shoes").allowlist) == (
        "passthrough", ("page", "q"))


def test_prefix_mode_matches_a_stripped_path_as_if_it_kept_its_slash() -> None:
    # Deliberate (docs/serving.md#route-classes): the reference classifies the canonical `/search` as
    # prerender because it no longer contains the `/search/` exclude.
    r = prefix_router()
    assert r.classify("/search").route_class == "passthrough"
    assert r.classify("/research").route_class == "prerender"
    assert r.classify("/").route_class == "prerender"


def test_with_preserve_a_path_is_matched_exactly_as_it_is() -> None:
    r = prefix_router(cacheKey={"trailingSlash": "preserve"})
    assert r.classify("/search").route_class == "prerender"
    assert r.classify("/search/").route_class == "passthrough"


def test_forwarded_mode_matches_the_raw_path_only() -> None:
    r = router(excludePathPatterns=["/search/"], routes=[{"match": "prefix", "path": "/"}])
    assert r.classify("/search").route_class == "prerender"
    assert r.classify("/search/").route_class == "passthrough"


_SEGMENT = st.sampled_from(["", "a", "ab", "search"])
_PATH = st.builds(lambda segs, slash: "/" + "/".join(segs) + slash, st.lists(_SEGMENT, max_size=3),
                  st.sampled_from(["", "/"]))
_ROUTE = st.fixed_dictionaries({"match": st.sampled_from(["exact", "prefix", "contains"]), "path": _PATH,
                                "mode": st.sampled_from(["prerender", "passthrough"])})


@settings(max_examples=500, deadline=None)
@given(routes=st.lists(_ROUTE, max_size=5), excludes=st.lists(_PATH, max_size=2), path=_PATH,
       mode=st.sampled_from(["prefix", "forwarded"]), slash=st.sampled_from(["strip", "preserve"]))
def test_first_match_is_the_first_route_whose_own_match_accepts_the_path_or_its_slash_alias(
        routes: list, excludes: list, path: str, mode: str, slash: str) -> None:
    r = Router(parse({"ingress": {"mode": mode, "routes": routes, "excludePathPatterns": excludes},
                      "cacheKey": {"trailingSlash": slash}}).config)
    spellings = [path]
    if mode == "prefix" and slash == "strip" and not path.endswith("/"):
        spellings.append(path + "/")
    expected = next((route for route in r.routes if any(route.matches(p) for p in spellings)), None)
    assert r.first_match(path) is expected


# ---------------------------------------------------------------------------------- allowlist_for


def test_the_allowlist_for_a_url_is_the_allowlist_of_its_path() -> None:
    r = router(routes=[PRODUCT, CART])
    assert r.allowlist_for("https://x.com/product/prd-1?CN=2") == r.classify("/product/prd-1").allowlist
    assert r.allowlist_for("https://x.com/product/prd-1") == ("CN",)
    assert r.allowlist_for("https://x.com/cart/1") == ("*",)
    assert r.allowlist_for("https://x.com/other") == ("*",)
    assert r.allowlist_for("https://x.com/a/../product/prd-1/") == ("CN",)  # the WHATWG path


def test_an_unparseable_url_keeps_every_param_in_forwarded_mode_and_the_global_list_in_prefix_mode() -> None:
    assert router(routes=[PRODUCT]).allowlist_for("not a url") == ("*",)
    assert prefix_router().allowlist_for("not a url") == ("page",)
    assert prefix_router().allowlist_for("https://x.com/product/prd-1") == ("page",)


# ------------------------------------------------------------------------------- render intervals


def test_a_bad_render_interval_drops_the_field_but_the_route_still_classifies() -> None:
    compiled = compile_route_list([{"match": "prefix", "path": "/a", "renderInterval": -5},
                                   {"match": "prefix", "path": "/b", "renderInterval": "daily"},
                                   {"match": "prefix", "path": "/c", "renderInterval": None},
                                   {"match": "prefix", "path": "/d", "renderInterval": 3_600_000}], [])
    assert [r.render_interval for r in compiled.routes] == [None, None, None, 3_600_000]
    assert sum("renderInterval" in w for w in compiled.warnings) == 2  # null is "unset", not warned


def test_the_render_interval_is_the_route_then_the_stored_value_then_the_default() -> None:
    r = Router(parse({"ingress": {"mode": "forwarded", "routes": [
        {"match": "prefix", "path": "/fast", "renderInterval": 60_000}, {"match": "prefix", "path": "/"}]},
        "render": {"defaultInterval": 86_400_000}}).config)
    assert r.render_interval("/fast/1", stored=5_000) == 60_000
    assert r.render_interval("/slow", stored=5_000) == 5_000
    assert r.render_interval("/slow", stored=2**70) == 2**70  # big stored values count
    for junk in (None, float("nan"), 0, -1, "soon", True):
        assert r.render_interval("/slow", stored=junk) == 86_400_000
