"""The pure decisions of sitemap ingestion (docs/sitemaps.md)."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prerender_ray.config.base import DAY, HOUR
from prerender_ray.config.model import Config
from prerender_ray.config.render import Page
from prerender_ray.identity.routes import Router
from prerender_ray.sitemaps.parser import SitemapEntry, SitemapError
from prerender_ray.sitemaps.refresh import RefreshResult
from prerender_ray.sitemaps.rules import (
    NO_TARGET,
    Action,
    PruneAction,
    PruneScan,
    canonicalizer,
    changefreq_interval,
    decide_action,
    describe_error,
    fast_action,
    fast_actions,
    filtered_log,
    filtered_share,
    partition_entries,
    plan_batch,
    prune_action,
    target_write,
)
from prerender_ray.timeutil import minute

PAGE = Page()
NOW = 1_700_000_000_123
CATALOG = {"match": "prefix", "path": "/catalog/", "queryParams": ["CN"]}
API = {"match": "prefix", "path": "/api/", "mode": "passthrough"}


def _cfg(mode: str = "prefix", routes: list[dict[str, Any]] | None = None, **ingress: Any) -> Config:
    return Config.model_validate({"ingress": {"mode": mode, "routes": routes or [], **ingress}})


def _partition(locs: list[str | None], cfg: Config, changefreq: str | None = None) -> Any:
    entries = [SitemapEntry(loc, None, changefreq) for loc in locs]
    return partition_entries(entries, Router(cfg).classify, canonicalizer(cfg))


# --------------------------------------------------------------------------------------- cadence


@pytest.mark.parametrize(
    ("changefreq", "interval"),
    [
        ("always", 6 * HOUR),
        ("hourly", 6 * HOUR),
        ("daily", DAY),
        ("weekly", 7 * DAY),
        ("monthly", 30 * DAY),
        ("yearly", 365 * DAY),
        ("never", 365 * DAY),
        (None, DAY),
        ("sometimes", DAY),
        (" Weekly ", 7 * DAY),
    ],
)
def test_changefreq_maps_to_an_interval_floored_at_min_ttl(changefreq: str | None, interval: int) -> None:
    assert changefreq_interval(changefreq, PAGE) == interval


def test_the_unknown_changefreq_default_is_page_ttl_and_also_floored() -> None:
    assert changefreq_interval("bogus", Page(ttl=2 * DAY)) == 2 * DAY
    assert changefreq_interval("bogus", Page(ttl=HOUR, min_ttl=3 * HOUR)) == 3 * HOUR


# ---------------------------------------------------------------------------------- partitioning


def test_forwarded_mode_keeps_prerender_entries_and_counts_the_rest_as_filtered() -> None:
    cfg = _cfg("forwarded", [CATALOG, API])
    p = _partition(["https://x.com/catalog/a", "https://x.com/api/v1", "https://x.com/blog/b"], cfg)
    assert list(p.incoming) == ["https://x.com/catalog/a"]
    assert p.filtered == {"passthrough": 1, "unclassified": 1}


def test_a_kept_entry_is_keyed_by_its_route_allowlisted_canonical_url() -> None:
    p = _partition(["https://x.com/catalog/a.jsp?CN=x&utm=y"], _cfg("forwarded", [CATALOG]))
    assert list(p.incoming) == ["https://x.com/catalog/a.jsp?CN=x"]


@pytest.mark.parametrize("mode", ["prefix", "forwarded"])
def test_a_folded_exclude_pattern_filters_as_passthrough_in_both_modes(mode: str) -> None:
    p = _partition(["https://x.com/search/shoes", "https://x.com/catalog/a"], _cfg(mode, [CATALOG]))
    assert p.filtered["passthrough"] == 1 and list(p.incoming) == ["https://x.com/catalog/a"]


def test_prefix_mode_keeps_everything_else_under_the_global_allowlist() -> None:
    p = _partition(["https://x.com/anything?page=2&utm=1", "https://x.com/"], _cfg("prefix"))
    assert list(p.incoming) == ["https://x.com/anything?page=2", "https://x.com/"]
    assert p.filtered == {"passthrough": 0, "unclassified": 0}


def test_malformed_locs_are_invalid_with_a_message_and_good_entries_survive() -> None:
    p = _partition(["not-a-url", "also/bad", "/relative", "https://x.com/ok", "mailto:a@x.com", None], _cfg())
    assert list(p.incoming) == ["https://x.com/ok"]
    assert [(i.loc, i.message) for i in p.invalid] == [
        ("not-a-url", "not a valid absolute http(s) URL"),
        ("also/bad", "not a valid absolute http(s) URL"),
        ("/relative", "not a valid absolute http(s) URL"),
        ("mailto:a@x.com", "not a valid absolute http(s) URL"),
        (None, "missing <loc>"),
    ]
    assert p.total == 6


def test_an_entry_the_canonicalizer_refuses_is_invalid_with_its_message() -> None:
    p = _partition(
        ["https://x.com:99999/a", "https://x.com/" + "a" * 9000, "https://x.com/ok"],
        _cfg("forwarded", [{"match": "prefix", "path": "/"}]),
    )
    assert list(p.incoming) == ["https://x.com/ok"] and len(p.invalid) == 2
    assert all(i.message for i in p.invalid)


def test_a_bad_host_is_invalid_rather_than_unclassified() -> None:
    p = _partition(["https://999.999.999.999/a", "https://exa mple.com/a"], _cfg("forwarded", [CATALOG]))
    assert p.filtered == {"passthrough": 0, "unclassified": 0} and len(p.invalid) == 2


def test_paths_needing_whatwg_normalization_classify_on_the_normalized_path() -> None:
    cfg = _cfg("forwarded", [CATALOG])
    p = _partition(
        ["https://x.com/x/../catalog/a", "https://x.com/%2E%2E/catalog/b", "HTTPS://X.COM/catalog/c"], cfg
    )
    assert sorted(p.incoming) == [
        "https://x.com/catalog/a",
        "https://x.com/catalog/b",
        "https://x.com/catalog/c",
    ]


def test_locs_that_canonicalize_alike_collapse_and_the_last_one_wins() -> None:
    cfg = _cfg()
    entries = [
        SitemapEntry("https://x.com/a?utm=1", changefreq="daily"),
        SitemapEntry("https://x.com/a/", changefreq="weekly"),
    ]
    p = partition_entries(entries, Router(cfg).classify, canonicalizer(cfg))
    assert p.incoming == {"https://x.com/a": entries[1]} and p.total == 2


def test_changefreq_survives_partitioning_and_drives_the_interval() -> None:
    p = _partition(["https://x.com/a"], _cfg(), changefreq="hourly")
    entry = p.incoming["https://x.com/a"]
    assert changefreq_interval(entry.changefreq, PAGE) == 6 * HOUR


def test_unknown_changefreq_values_of_kept_entries_are_counted() -> None:
    cfg = _cfg()
    entries = [
        SitemapEntry("https://x.com/a", changefreq="sometimes"),
        SitemapEntry("https://x.com/b", changefreq="daily"),
    ]
    assert partition_entries(entries, Router(cfg).classify, canonicalizer(cfg)).unknown_changefreq == 1


def test_no_entries_value_gives_an_empty_partition_with_zero_counts() -> None:
    p = partition_entries(None, Router(_cfg()).classify, canonicalizer(_cfg()))
    assert (p.incoming, p.filtered, p.invalid, p.total) == ({}, {"passthrough": 0, "unclassified": 0}, [], 0)


def test_an_empty_urlset_is_not_reconciled_so_its_targets_stay_attributed() -> None:
    assert not _partition([], _cfg()).reconciles
    assert _partition(["not-a-url"], _cfg()).reconciles  # a document of bad entries still prunes


def test_urls_of_a_host_outside_the_configured_domains_are_invalid_and_reported() -> None:
    cfg = Config.model_validate({"domains": ["x.com", "Bücher.de"]})
    p = _partition(["https://x.com/a", "https://evil.test/a", "https://BÜCHER.de/b", "http://x.com:8080/c"],
                   cfg)
    assert list(p.incoming) == ["https://x.com/a", "https://xn--bcher-kva.de/b"]
    assert [(i.loc, i.message) for i in p.invalid] == [
        ("https://evil.test/a", "evil.test is not allowed by domains; add 'evil.test' or 'evil.test:*'"),
        ("http://x.com:8080/c", "x.com:8080 is not allowed by domains; add 'x.com:8080' or 'x.com:*'"),
    ]
    result = RefreshResult()
    result.add_partition(S1, p)
    assert result.invalid == 2 and result.invalid_sample[0]["loc"] == "https://evil.test/a"


def test_without_configured_domains_every_host_is_kept() -> None:
    assert len(_partition(["https://x.com/a", "https://y.org/b"], _cfg()).incoming) == 2


def test_the_canonicalizer_follows_the_cache_key_options() -> None:
    cfg = Config.model_validate({"cacheKey": {"trailingSlash": "preserve", "queryParams": ["*"]}})
    assert canonicalizer(cfg)("https://x.com/a/?b=2&a=1", ["*"]) == "https://x.com/a/?a=1&b=2"


# -------------------------------------------------------------------------------- filtered share


@pytest.mark.parametrize(
    ("filtered", "total", "share"), [(0, 0, 0), (1, 200, 1), (1, 201, 0), (1, 3, 33), (2, 3, 67), (5, 5, 100)]
)
def test_the_filtered_share_rounds_half_up(filtered: int, total: int, share: int) -> None:
    assert filtered_share(filtered, total) == share


def test_the_filtered_log_is_an_error_at_the_threshold_and_info_below() -> None:
    cfg = _cfg("forwarded", [CATALOG])
    half = _partition(["https://x.com/catalog/a", "https://x.com/blog/b"], cfg)
    some = _partition(["https://x.com/catalog/a", "https://x.com/catalog/b", "https://x.com/blog/b"], cfg)
    error = filtered_log("https://x.com/s.xml", half, 50)
    assert error is not None and error.level == "error" and "check ingress.routes" in error.message
    info = filtered_log("https://x.com/s.xml", some, 50)
    assert info is not None and info.level == "info"


def test_nothing_is_logged_when_nothing_was_filtered_and_any_filtering_errs_at_zero() -> None:
    cfg = _cfg("forwarded", [CATALOG])
    assert filtered_log("s", _partition(["https://x.com/catalog/a"], cfg), 0) is None
    tiny = _partition(["https://x.com/blog"] + [f"https://x.com/catalog/{i}" for i in range(999)], cfg)
    assert filtered_share(tiny.filtered_count, tiny.total) == 0
    log = filtered_log("s", tiny, 0)
    assert log is not None and log.level == "error"


def test_invalid_entries_count_in_the_filtered_share_base() -> None:
    p = _partition(
        ["https://x.com/blog/a", "not-a-url", "not-a-url-either", "https://x.com/catalog/a"],
        _cfg("forwarded", [CATALOG]),
    )
    assert filtered_share(p.filtered_count, p.total) == 25


# --------------------------------------------------------------------------------------- actions

S1, S2, S3 = "https://x.com/s1.xml", "https://x.com/s2.xml", "https://x.com/s3.xml"
URL = "https://x.com/a"


@pytest.mark.parametrize(
    ("existing", "visited", "action"),
    [
        (NO_TARGET, set(), Action.CREATE),
        (S1, {S1}, Action.SKIP),
        (S2, set(), Action.REATTACH),
        (None, set(), Action.REATTACH),
        (None, {S1, S2}, Action.REATTACH),
        (S2, {S1, S2}, Action.DUPLICATE),
        (S3, {S1, S2}, Action.REATTACH),
    ],
)
def test_the_action_follows_the_existing_owner(existing: Any, visited: set[str], action: Action) -> None:
    assert decide_action(URL, S1, existing, visited=visited) is action


def test_revalidate_renders_even_known_and_owned_targets() -> None:
    for existing in (NO_TARGET, S1, S2, None):
        assert (
            decide_action(URL, S1, existing, visited={S1, S2}, known_keys={URL}, revalidate=True)
            is Action.RENDER
        )


def test_known_keys_are_only_a_fast_path() -> None:
    assert fast_action(URL, known_keys={URL}, revalidate=False) is Action.SKIP
    assert fast_action(URL, known_keys={"https://x.com/other"}, revalidate=False) is None
    assert fast_action(URL, known_keys=None, revalidate=False) is None
    assert fast_action(URL, known_keys={URL}, revalidate=True) is Action.RENDER


@pytest.mark.parametrize("revalidate", [False, True])
@pytest.mark.parametrize("known", [None, set(), {"https://x.com/a", "https://x.com/c"}])
def test_fast_actions_of_a_document_are_fast_action_of_each_url(known: set | None, revalidate: bool) -> None:
    incoming = {f"https://x.com/{c}": c for c in "abcd"}
    renders, reads = fast_actions(incoming, known_keys=known, revalidate=revalidate)
    for url, entry in incoming.items():
        fast = fast_action(url, known_keys=known, revalidate=revalidate)
        assert ((url, entry) in renders, (url, entry) in reads) == (fast is Action.RENDER, fast is None)
    assert decide_action(URL, S1, S2, visited={S2}, known_keys=set()) is Action.DUPLICATE


def test_the_existing_owner_must_be_read_as_a_value_not_a_record() -> None:
    with pytest.raises(TypeError):
        decide_action(URL, S1, {"sitemapUrl": S1}, visited=set())  # type: ignore[arg-type]


def test_writes_put_on_create_and_render_patch_on_reattach_and_nothing_otherwise() -> None:
    entry = SitemapEntry(URL, changefreq="weekly")
    render = target_write(Action.RENDER, URL, S1, entry, PAGE, NOW)
    create = target_write(Action.CREATE, URL, S1, entry, PAGE, NOW)
    patch = target_write(Action.REATTACH, URL, S1, entry, PAGE, NOW)
    assert render is not None and (render.op, render.next_render_time, render.render_interval) == (
        "put",
        minute(NOW),
        7 * DAY,
    )
    assert create is not None and (create.op, create.next_render_time) == ("put", None)
    assert patch is not None and (patch.op, patch.sitemap_url, patch.render_interval) == (
        "patch",
        S1,
        7 * DAY,
    )
    assert target_write(Action.SKIP, URL, S1, entry, PAGE, NOW) is None
    assert target_write(Action.DUPLICATE, URL, S1, entry, PAGE, NOW) is None


_FREQS = st.sampled_from([None, "daily", "WEEKLY", " monthly ", "always", "sometimes"])
_HELD = st.sampled_from([NO_TARGET, None, S1, S2, S3])


@given(st.lists(st.tuples(st.integers(0, 30), _FREQS, _HELD), max_size=12), st.booleans(),
       st.sampled_from([set(), {S1}, {S1, S2}]), st.booleans())
def test_a_batch_plan_is_decide_then_write_entry_by_entry(rows: list[tuple], revalidate: bool,
                                                          visited: set[str], read: bool) -> None:
    """The walk's batch path against the per-entry rules it stands for."""
    items = [(f"https://x.com/p{n}", SitemapEntry(f"https://x.com/p{n}", changefreq=f)) for n, f, _ in rows]
    existing = [held for _, _, held in rows] if read else None
    plan = plan_batch(S1, items, existing, visited=visited, revalidate=revalidate, page_cfg=PAGE, now_ms=NOW)
    counts: dict[Action, int] = {}
    puts, patches = [], []
    for i, (url, entry) in enumerate(items):
        action = decide_action(url, S1, existing[i] if read else NO_TARGET, visited=visited,
                               revalidate=revalidate)
        counts[action] = counts.get(action, 0) + 1
        write = target_write(action, url, S1, entry, PAGE, NOW)
        if write is not None and write.op == "put":
            puts.append((url, write.render_interval, write.next_render_time))
        elif write is not None:
            patches.append((url, {"sitemap_url": S1, "render_interval": write.render_interval}))
    assert plan.counts == counts
    assert list(zip(plan.urls, plan.intervals, plan.dues)) == puts
    assert plan.patches == patches


class _Walker:
    """Two walks over the pure rules with targets in a dict: only what the reconcile step would do."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.router = Router(cfg)
        self.targets: dict[str, dict[str, Any]] = {}

    def walk(self, docs: dict[str, list[str]], root: str, *, revalidate: bool = False) -> RefreshResult:
        result = RefreshResult.from_config(self.cfg.sitemap)
        queue, visited = [root], set[str]()
        while queue:
            url = queue.pop(0)
            visited.add(url)
            if url.endswith("index.xml"):
                queue += [loc for loc in docs[url] if loc not in visited and loc not in queue]
            else:
                self._urlset(url, docs[url], visited, result, revalidate)
        return result

    def _urlset(
        self, url: str, locs: list[str], visited: set[str], result: RefreshResult, revalidate: bool
    ) -> None:
        p = partition_entries(
            [SitemapEntry(loc) for loc in locs], self.router.classify, canonicalizer(self.cfg)
        )
        result.add_partition(url, p)
        if not p.reconciles:
            return
        scan = PruneScan(url, p.incoming, self.router.classify, self.cfg.scan.collect_cap)
        for key, row in list(self.targets.items()):
            if row["sitemapUrl"] == url:
                scan.add(key)
        for key in scan.departed:
            self.targets[key]["sitemapUrl"] = None
        result.add_removed(scan.departed)
        result.add_prune(scan)
        for key, entry in p.incoming.items():
            existing = self.targets[key]["sitemapUrl"] if key in self.targets else NO_TARGET
            action = decide_action(
                key, url, existing, visited=visited, known_keys=scan.known_keys, revalidate=revalidate
            )
            result.count(action)
            write = target_write(action, key, url, entry, self.cfg.page, NOW)
            if write is not None:
                self.targets.setdefault(key, {})["sitemapUrl"] = write.sitemap_url


def test_a_second_walk_over_overlapping_children_converges_to_zero_writes() -> None:
    docs = {
        "https://x.com/index.xml": ["https://x.com/a.xml", "https://x.com/b.xml"],
        "https://x.com/a.xml": ["https://x.com/1", "https://x.com/2"],
        "https://x.com/b.xml": ["https://x.com/2", "https://x.com/3"],
    }
    walker = _Walker(_cfg())
    first = walker.walk(docs, "https://x.com/index.xml")
    assert (first.created, first.duplicates, first.updated) == (3, 1, 0)
    second = walker.walk(docs, "https://x.com/index.xml")
    assert (second.created, second.updated, second.skipped, second.duplicates) == (0, 0, 3, 1)
    assert walker.targets["https://x.com/2"]["sitemapUrl"] == "https://x.com/a.xml"


def test_with_revalidate_overlapping_urls_end_owned_by_the_last_document() -> None:
    docs = {
        "https://x.com/index.xml": ["https://x.com/a.xml", "https://x.com/b.xml"],
        "https://x.com/a.xml": ["https://x.com/1", "https://x.com/2"],
        "https://x.com/b.xml": ["https://x.com/2"],
    }
    walker = _Walker(_cfg())
    result = walker.walk(docs, "https://x.com/index.xml", revalidate=True)
    assert (result.created, result.duplicates) == (3, 0)
    assert walker.targets["https://x.com/2"]["sitemapUrl"] == "https://x.com/b.xml"


def test_urls_that_left_the_sitemap_are_unlinked_and_deferred_ones_stay_attributed() -> None:
    cfg = _cfg("forwarded", [CATALOG])
    walker = _Walker(cfg)
    walker.targets = {
        "https://x.com/catalog/kept": {"sitemapUrl": S1},
        "https://x.com/catalog/gone": {"sitemapUrl": S1},
        "https://x.com/blog/no-longer-routed": {"sitemapUrl": S1},
        "https://x.com/catalog/elsewhere": {"sitemapUrl": S2},
    }
    result = walker.walk({S1: ["https://x.com/catalog/kept"]}, S1)
    assert (result.removed, result.removed_sample, result.deferred, result.skipped) == (
        1,
        ["https://x.com/catalog/gone"],
        1,
        1,
    )
    assert walker.targets["https://x.com/catalog/gone"]["sitemapUrl"] is None
    assert walker.targets["https://x.com/blog/no-longer-routed"]["sitemapUrl"] == S1
    assert walker.targets["https://x.com/catalog/elsewhere"]["sitemapUrl"] == S2


def test_an_empty_urlset_leaves_its_targets_attributed() -> None:
    walker = _Walker(_cfg())
    walker.targets = {"https://x.com/a": {"sitemapUrl": S1}}
    result = walker.walk({S1: []}, S1)
    assert result.removed == 0 and walker.targets["https://x.com/a"]["sitemapUrl"] == S1


# ------------------------------------------------------------------------------------ prune scan


def test_prune_actions_keep_listed_defer_unrouted_and_unlink_the_rest() -> None:
    classify = Router(_cfg("forwarded", [CATALOG])).classify
    incoming = {"https://x.com/catalog/a": object()}
    assert prune_action("https://x.com/catalog/a", incoming, classify) is PruneAction.KEEP
    assert prune_action("https://x.com/catalog/b", incoming, classify) is PruneAction.UNLINK
    assert prune_action("https://x.com/blog/b", incoming, classify) is PruneAction.DEFER


def test_the_prune_scan_examines_everything_but_collects_up_to_the_cap() -> None:
    classify = Router(_cfg()).classify
    scan = PruneScan(S1, {f"https://x.com/k{i}": 1 for i in range(5)}, classify, collect_cap=3)
    for i in range(10):
        scan.add(f"https://x.com/k{i}")
    assert scan.examined == 10 and len(scan.known_keys) == 3
    assert scan.departed == ["https://x.com/k5", "https://x.com/k6", "https://x.com/k7"] and scan.truncated
    result = RefreshResult()
    result.add_prune(scan)
    assert result.truncated_scans == [{"sitemapUrl": S1, "examined": 10, "collected": 3}]


def test_a_scan_below_the_cap_is_not_truncated() -> None:
    scan = PruneScan(S1, {}, Router(_cfg()).classify, collect_cap=3)
    scan.add("https://x.com/a")
    result = RefreshResult()
    result.add_prune(scan)
    assert not scan.truncated and result.truncated_scans == []


# -------------------------------------------------------------------------------- describe_error


def test_describe_error_joins_the_cause_chain_with_codes() -> None:
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        except OSError as low:
            raise RuntimeError("fetch failed") from low
    except RuntimeError as e:
        assert describe_error(e) == "fetch failed: Connection refused (ECONNREFUSED)"


def test_describe_error_says_a_repeated_message_once_and_names_silent_errors() -> None:
    inner = TimeoutError()
    outer = TimeoutError()
    outer.__cause__ = inner
    assert describe_error(outer) == "TimeoutError"
    err = ValueError("bad")
    err.__cause__ = SitemapError("bad", "X")
    assert describe_error(err) == "bad: bad (X)"


def test_describe_error_survives_a_cyclic_cause_chain() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert describe_error(a) == "a: b"


def test_a_walks_answer_says_when_its_new_pages_first_render() -> None:
    from prerender_ray.config.model import Config
    from prerender_ray.sitemaps.rules import first_renders

    page = Config().page
    assert first_renders(True, page)["when"] == "now"
    assert first_renders(False, page)["when"] == "now"  # render.firstRender's default
    assert "render.firstRender" in first_renders(False, page, "now")["note"]
    spread = first_renders(False, page, "staggered")
    assert spread["when"] == "spread" and spread["defaultCadenceMs"] == page.ttl
    assert spread["longestCadenceMs"] == 365 * 86_400_000 and "revalidate" in spread["note"]
