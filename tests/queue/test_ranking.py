"""The keeper's ranking structure (docs/queue.md#ranking)."""

from __future__ import annotations

import math
import random
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.queue.ranking import Ranking
from prerender_ray.queue.row_classes import Held, top_k_bruteforce
from prerender_ray.queue.schedule import ScheduleRow, decode_many
from prerender_ray.timeutil import DAY_MS, HOUR_MS, MINUTE_MS, positive

NOW = 1_779_999_960_000  # minute-aligned
ROUTE_CADENCE = {"catalog": 6 * HOUR_MS, "blog": 7 * DAY_MS, "broken": 0}  # broken: raw lateness in ms


def cadence_or(default: int, route: Any) -> int:
    return ROUTE_CADENCE.get(route, default)


cadence_for = partial(cadence_or, DAY_MS)


def key(name: str, device: str = "desktop") -> str:
    return f"https://shop.test/{name}|{device}"


def ranking(*rows: tuple[str, Any, bool, Any, Any], boost: float = 2.0) -> Ranking:
    r = Ranking(cadence_for, boost=boost)
    for row in rows:
        r.upsert(*row)
    return r


def test_a_row_is_held_read_back_and_removed() -> None:
    r = ranking((key("a"), NOW, True, HOUR_MS, "catalog"))
    assert len(r) == 1 and key("a") in r
    assert r.get(key("a")) == Held(key("a"), NOW, True, HOUR_MS, "catalog")
    assert r.remove(key("a")) is True
    assert r.remove(key("a")) is False
    assert r.get(key("a")) is None and len(r) == 0
    assert r.top_k(10, NOW) == []


def test_an_upsert_replaces_the_held_row() -> None:
    r = ranking((key("a"), NOW - HOUR_MS, True, HOUR_MS, None))
    r.upsert(key("a"), NOW + HOUR_MS, False, None, "blog")
    assert r.get(key("a")) == Held(key("a"), NOW + HOUR_MS, False, None, "blog")
    assert len(r) == 1
    assert r.top_k(10, NOW) == []


def test_junk_carried_cadences_are_held_as_none() -> None:
    for junk in (0, -1, None, math.nan, "nonsense"):
        r = ranking((key("a"), NOW, True, junk, None))
        held = r.get(key("a"))
        assert held is not None and held.interval is None
    held = ranking((key("a"), NOW, True, "3600000", None)).get(key("a"))
    assert held is not None and held.interval == HOUR_MS


def test_a_row_without_a_due_time_is_held_but_never_due() -> None:
    r = ranking((key("a"), None, True, HOUR_MS, None), (key("b"), math.nan, True, HOUR_MS, None))
    assert len(r) == 2
    assert r.get(key("a")) == Held(key("a"), None, True, HOUR_MS, None)
    assert r.top_k(10, NOW + 365 * DAY_MS) == []
    assert r.score_of(key("a"), NOW) is None
    state = r.state(NOW)
    assert state["undated"] == 2 and state["now"]["due"] == 0 and state["held"] == 2


def test_a_due_time_at_the_epoch_is_valid_and_first_in_line() -> None:
    r = ranking((key("late"), NOW - 10 * DAY_MS, True, HOUR_MS, None),
                (key("zero"), 0, False, DAY_MS, None), (key("one"), 1, False, DAY_MS, None))
    assert r.top_k(2, NOW) == [key("zero"), key("one")]


def test_not_yet_due_rows_are_never_published() -> None:
    r = ranking((key("now"), NOW, False, HOUR_MS, None), (key("soon"), NOW + 1, True, MINUTE_MS, None),
                (key("past"), NOW - 1, False, HOUR_MS, None))
    assert r.top_k(10, NOW) == [key("past"), key("now")]  # due is inclusive
    assert r.top_k(10, NOW + 1) == [key("past"), key("now"), key("soon")]


def test_a_late_sitemap_homepage_beats_a_three_day_late_product_page() -> None:
    r = ranking((key("pdp"), NOW - 3 * DAY_MS, False, 48 * HOUR_MS, None),
                (key("home"), NOW - HOUR_MS, True, HOUR_MS, None))
    assert r.top_k(2, NOW) == [key("home"), key("pdp")]


def test_the_sitemap_boost_orders_a_listed_page_first_at_equal_lateness() -> None:
    rows = ((key("found"), NOW - HOUR_MS, False, DAY_MS, None),
            (key("listed"), NOW - HOUR_MS, True, DAY_MS, None))
    assert ranking(*rows).top_k(2, NOW) == [key("listed"), key("found")]
    assert ranking(*rows, boost=1).top_k(2, NOW) == [key("found"), key("listed")]  # ties break on key


def test_a_discovered_row_overtakes_once_its_ratio_exceeds_the_boosted_one() -> None:
    r = ranking((key("found"), NOW - 3 * HOUR_MS, False, HOUR_MS, None),
                (key("listed"), NOW - HOUR_MS, True, HOUR_MS, None))
    assert r.top_k(2, NOW) == [key("found"), key("listed")]


def test_a_promoted_row_six_hours_late_beats_a_48_hour_row_twelve_hours_late() -> None:
    r = ranking((key("ceiling"), NOW - 12 * HOUR_MS, False, 48 * HOUR_MS, None),
                (key("rung"), NOW - 6 * HOUR_MS, False, 6 * HOUR_MS, None))
    assert r.top_k(2, NOW) == [key("rung"), key("ceiling")]


def test_junk_carried_cadences_fall_back_to_config_and_never_jump_the_queue() -> None:
    for junk in (0, -1, None, math.nan, "nonsense"):
        r = ranking((key("junk"), NOW - 12 * HOUR_MS, False, junk, None),
                    (key("real"), NOW - 13 * HOUR_MS, False, DAY_MS, None))
        assert r.top_k(2, NOW) == [key("real"), key("junk")]
        assert r.score_of(key("junk"), NOW) == 0.5


def test_a_row_without_a_carried_cadence_is_scored_from_its_route() -> None:
    r = ranking((key("plain"), NOW - 6 * HOUR_MS, False, None, None),
                (key("catalog"), NOW - 6 * HOUR_MS, False, None, "catalog"))
    assert r.top_k(2, NOW) == [key("catalog"), key("plain")]
    assert r.score_of(key("catalog"), NOW) == 1.0 and r.score_of(key("plain"), NOW) == 0.25


def test_scores_use_now_floored_to_the_minute() -> None:
    r = ranking((key("a"), NOW - HOUR_MS, False, HOUR_MS, None))
    assert r.score_of(key("a"), NOW + 59_999) == 1.0
    assert r.entries([key("a"), key("missing")], NOW + 59_999) == [(key("a"), NOW - HOUR_MS, 1.0, False)]


def test_leased_rows_at_the_head_do_not_block_rows_behind_them() -> None:
    rows = [(key(f"p{i}"), NOW - (10 - i) * HOUR_MS, False, HOUR_MS, None) for i in range(10)]
    r = ranking(*rows)
    leased = {key("p0"), key("p1"), key("p2")}
    assert r.top_k(3, NOW, leased.__contains__) == [key("p3"), key("p4"), key("p5")]
    assert r.top_k(3, NOW) == [key("p0"), key("p1"), key("p2")]


def test_top_k_is_bounded_by_k_and_drains_best_first() -> None:
    rnd = random.Random(5)
    rows = [(key(f"p{i}", d), NOW - rnd.randrange(0, 4 * DAY_MS, MINUTE_MS), rnd.random() < 0.5,
             rnd.choice([HOUR_MS, 6 * HOUR_MS, DAY_MS, None]), rnd.choice([None, "catalog", "blog"]))
            for i in range(400) for d in ("desktop", "mobile")]
    r = ranking(*rows)
    top = r.top_k(50, NOW)
    assert len(top) == 50
    scores = [e[2] for e in r.entries(top, NOW)]
    assert scores == sorted(scores, reverse=True)
    assert r.top_k(5000, NOW) == r.top_k(len(rows), NOW)
    assert len(r.top_k(5000, NOW)) == len(rows)


def test_the_best_rows_win_whatever_the_arrival_order() -> None:
    rnd = random.Random(9)
    rows = [(key(f"p{i}"), NOW - rnd.randrange(0, 2 * DAY_MS, MINUTE_MS), rnd.random() < 0.5,
             rnd.choice([HOUR_MS, DAY_MS]), None) for i in range(300)]
    expected = ranking(*rows).top_k(40, NOW)
    for _ in range(5):
        rnd.shuffle(rows)
        assert ranking(*rows).top_k(40, NOW) == expected


def test_device_variants_keep_their_sitemap_flag_through_the_ranking() -> None:
    r = ranking((key("a"), NOW - HOUR_MS, True, HOUR_MS, None),
                (key("b"), NOW - HOUR_MS, False, HOUR_MS, None))
    assert [(e[0], e[3]) for e in r.entries(r.top_k(5, NOW), NOW)] == [(key("a"), True), (key("b"), False)]


def test_upsert_many_equals_one_upsert_at_a_time_and_asks_the_route_once_per_url() -> None:
    rows = [ScheduleRow(key(f"p{i // 2}", ("desktop", "mobile")[i % 2]), NOW - i * MINUTE_MS, i % 3 == 0,
                        (None, HOUR_MS, 0)[i % 3]) for i in range(40)]
    rows.append(ScheduleRow("no-delimiter", NOW, False, None))
    rows.append(ScheduleRow("no-delimiter-2", NOW, False, None))
    rows.append(rows[3]._replace(next_render_time=NOW - DAY_MS))  # an existing key: replaced
    asked: list[str] = []

    def route_of(k: str) -> Any:
        asked.append(k)
        return "catalog" if "p1" in k else None

    bulk = Ranking(cadence_for)
    assert bulk.upsert_many(decode_many((r.cache_key, r.encode()) for r in rows), route_of) == len(rows)
    assert asked.count(key("p0")) == 1 and key("p0", "mobile") not in asked
    assert len(asked) == 20 + 2 + 1  # one per URL, per non-key, and the out-of-order repeat
    one = Ranking(cadence_for)
    for row in rows:
        one.upsert(*row, route_of(row.cache_key))
    assert sorted(bulk.rows()) == sorted(one.rows())
    assert bulk.top_k(100, NOW) == one.top_k(100, NOW)


def test_upsert_many_shares_a_bucket_only_between_device_variants_with_the_same_values() -> None:
    """As put_many builds them, a URL's device rows carry the very same due and cadence objects; a
    variant that differs in any one value gets its own bucket."""
    due, later, cadence = NOW - HOUR_MS, NOW - MINUTE_MS, HOUR_MS
    rows: list[tuple] = []
    variants = [(due, True, cadence), (later, True, cadence), (due, False, cadence), (due, True, 2 * HOUR_MS),
                (due, True, None), (None, True, cadence)]
    for i, (d, s, c) in enumerate(variants):
        rows += [(key(f"v{i}"), due, True, cadence), (key(f"v{i}", "mobile"), d, s, c)]
    rows += [rows[0], (key("v0", "tablet"), due, True, cadence), rows[1]]  # held, new, held
    bulk = Ranking(cadence_for)
    assert bulk.upsert_many(rows, lambda k: None) == len(rows)
    one = Ranking(cadence_for)
    for row in rows:
        one.upsert(*row, None)
    assert len(bulk) == 13 and sorted(bulk.rows()) == sorted(one.rows())
    assert bulk.top_k(100, NOW) == one.top_k(100, NOW)


def test_a_bulk_upsert_sorts_a_future_bucket_when_it_comes_due_and_a_planned_one_at_once() -> None:
    def bulk(r: Ranking, due: int, *names: str) -> None:
        r.upsert_many([(key(n), due, True, HOUR_MS) for n in names], lambda k: None)

    r = Ranking(cadence_for)
    bulk(r, NOW + HOUR_MS, "p6", "p1", "p4")  # out of key order, into a bucket not due yet
    assert r.top_k(10, NOW) == [] and len(r._unsorted) == 1
    assert r.top_k(10, NOW + HOUR_MS) == [key("p1"), key("p4"), key("p6")] and not r._unsorted

    bulk(r, NOW - HOUR_MS, "p9", "p7")  # a due bucket: the plan walks it live, so it stays sorted
    assert r.top_k(10, NOW + HOUR_MS)[:2] == [key("p7"), key("p9")]
    bulk(r, NOW - HOUR_MS, "p2")
    assert r.top_k(10, NOW + HOUR_MS)[:3] == [key("p2"), key("p7"), key("p9")] and not r._unsorted


def test_a_moved_row_keeps_one_copy_of_its_key() -> None:
    r = ranking(("https://shop.test/" + "x" * 40 + "|desktop", NOW, False, None, None))
    fresh = "".join(["https://shop.test/", "x" * 40, "|desktop"])  # equal, but another object
    r.upsert(fresh, NOW - HOUR_MS, False, None, None)
    held = next(iter(r._where))
    assert r._where[held][0] is held


def test_reclassify_reprices_rows_without_a_carried_cadence() -> None:
    r = ranking((key("plain"), NOW - 6 * HOUR_MS, False, None, None),
                (key("carried"), NOW - 6 * HOUR_MS, False, 12 * HOUR_MS, None))
    assert r.top_k(2, NOW) == [key("carried"), key("plain")]
    assert r.reclassify(lambda route: 3 * HOUR_MS) == 0
    assert r.top_k(2, NOW) == [key("plain"), key("carried")]
    assert r.score_of(key("plain"), NOW) == 2.0


def test_reclassify_moves_rows_to_their_new_route() -> None:
    r = ranking((key("a"), NOW - 6 * HOUR_MS, False, None, None),
                (key("b"), NOW - 7 * HOUR_MS, False, None, None))
    moved = r.reclassify(cadence_for, route_of=lambda k: "catalog" if "/a|" in k else None, boost=3)
    assert moved == 1
    held = r.get(key("a"))
    assert held is not None and held.route == "catalog"
    assert r.top_k(2, NOW) == [key("a"), key("b")]


def test_drop_where_removes_rows_no_longer_owned() -> None:
    r = ranking(*[(key(f"p{i}"), NOW, False, None, None) for i in range(10)])
    assert r.drop_where(lambda k: int(k.split("/p")[1].split("|")[0]) % 2 == 0) == 5
    assert len(r) == 5 and key("p0") not in r and key("p1") in r


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 5), st.sampled_from([1, 2, 3, 7]), st.booleans())
def test_drop_where_equals_removing_each_row_whatever_the_buckets(seed: int, dues: int, every: int, planned: bool) -> None:
    """A bulk put leaves big shared buckets; dropping rows filters each bucket once: the same held
    rows, ranking, queue-state and plan as taking them out one by one (a plan or a queue-state
    built before the drop must see it)."""
    rnd = random.Random(seed)
    rows = [(key(f"p{i}", d), NOW - rnd.randrange(dues) * MINUTE_MS, rnd.random() < 0.3,
             rnd.choice([None, DAY_MS]), None) for i in range(rnd.randrange(1, 120)) for d in ("desktop", "mobile")]
    rnd.shuffle(rows)
    bulk, single = Ranking(cadence_for), Ranking(cadence_for)
    for r in (bulk, single):
        r.upsert_many([row[:4] for row in rows], lambda k: None)
        if planned:
            r.top_k(10, NOW)
            r.state(NOW)
    doomed = {row[0] for row in rows  # every == 1: the rows due now, whole buckets emptied
              if (row[1] == NOW if every == 1 else int(row[0].split("/p")[1].split("|")[0]) % every == 0)}
    assert bulk.drop_where(doomed.__contains__) == len(doomed)
    for k in doomed:
        single.remove(k)
    assert len(bulk) == len(single) and all(k not in bulk for k in doomed)
    assert [tuple(h) for h in bulk.rows()] == [tuple(h) for h in single.rows()]
    for k in (1, 5, 500):
        assert bulk.top_k(k, NOW) == single.top_k(k, NOW)
    _same_state(bulk, NOW, set())
    assert bulk.state(NOW) == single.state(NOW)


def test_the_queue_state_counts_are_exact() -> None:
    r = ranking(
        (key("a"), NOW - 6 * HOUR_MS, True, DAY_MS, None),  # 0.25 cadences late: the edge is inclusive
        (key("b"), NOW - DAY_MS, False, DAY_MS, None),  # 1.0
        (key("c"), NOW, True, DAY_MS, None),  # due now, 0 late
        (key("d"), NOW - 4 * DAY_MS, False, None, "catalog"),  # 16 cadences
        (key("k"), NOW - 2 * HOUR_MS, False, None, "catalog"),  # 1/3
        (key("e"), NOW + 15 * MINUTE_MS, True, DAY_MS, None),
        (key("f"), NOW + 15 * MINUTE_MS + 1, True, DAY_MS, None),
        (key("g"), NOW + HOUR_MS, True, DAY_MS, None),
        (key("h"), NOW + HOUR_MS + 1, True, DAY_MS, None),
        (key("i"), NOW + 25 * HOUR_MS, True, DAY_MS, None),
        (key("j"), None, True, DAY_MS, None),
    )
    s = r.state(NOW, leased=[key("b"), key("e"), key("unknown")])
    assert s["held"] == 11 and s["undated"] == 1
    assert s["now"] == {"due": 5, "dueSitemap": 2, "dueDiscovered": 3, "leased": 1}
    assert s["coming"]["next15m"] == 1 and s["coming"]["next60m"] == 3 and s["coming"]["next24h"] == 4
    assert s["coming"]["byHour"][:2] == [3, 1] and sum(s["coming"]["byHour"]) == 4
    assert s["lateness"]["edges"] == [0.25, 1.0, 2.0, 4.0]
    assert s["lateness"]["sitemap"] == [1, 1, 0, 0, 0]
    assert s["lateness"]["discovered"] == [0, 1, 1, 0, 1]
    assert s["lateness"]["byRoute"] == {"default": [1, 1, 1, 0, 0], "catalog": [0, 1, 0, 0, 1]}
    hist = s["dueHistogram"]
    assert hist["fromMs"] == NOW - DAY_MS and hist["binMs"] == HOUR_MS
    assert {i: n for i, n in enumerate(hist["bins"]) if n} == {0: 1, 18: 1, 22: 1, 24: 3, 25: 2}
    assert hist["before"] == 1 and hist["after"] == 1
    catalog = [c for c in s["classes"] if c["route"] == "catalog"]
    assert catalog == [{"route": "catalog", "cadence": 6 * HOUR_MS, "carried": False, "fromSitemap": False,
                        "rows": 2, "due": 2, "oldestDue": NOW - 4 * DAY_MS}]
    assert sum(c["rows"] for c in s["classes"]) == 11


def state_per_row(r: Ranking, now: int, leased: set[str]) -> dict[str, Any]:
    """The queue-state counts computed row by row, the slow obvious way."""
    now_min = now - now % MINUTE_MS
    due = {True: 0, False: 0}
    coming = {"next15m": 0, "next60m": 0, "next24h": 0}
    by_hour, hist = [0] * 24, [0] * 48
    before = after = undated = in_flight = 0
    late = {True: [0] * 5, False: [0] * 5}
    by_route: dict[str, list[int]] = {}
    for row in r.rows():
        if row.due is None:
            undated += 1
            continue
        offset = row.due - now
        slot = offset // HOUR_MS + 24
        if slot < 0:
            before += 1
        elif slot >= 48:
            after += 1
        else:
            hist[slot] += 1
        if offset <= 0:
            due[row.from_sitemap] += 1
            in_flight += row.key in leased
            cadence = positive(row.interval) or positive(r._cadence_for(row.route)) or 1
            lateness = max(0, now_min - row.due)
            lane = sum(1 for edge in (0.25, 1, 2, 4) if lateness >= edge * cadence)
            late[row.from_sitemap][lane] += 1
            by_route.setdefault("default" if row.route is None else str(row.route), [0] * 5)[lane] += 1
            continue
        for name, span in (("next15m", 15 * MINUTE_MS), ("next60m", HOUR_MS), ("next24h", DAY_MS)):
            coming[name] += offset <= span
        if (offset - 1) // HOUR_MS < 24:
            by_hour[(offset - 1) // HOUR_MS] += 1
    return {"undated": undated, "now": {"due": due[True] + due[False], "dueSitemap": due[True],
                                        "dueDiscovered": due[False], "leased": in_flight},
            "coming": {**coming, "byHour": by_hour}, "sitemap": late[True], "discovered": late[False],
            "byRoute": by_route, "bins": hist, "before": before, "after": after}


def test_a_class_with_a_junk_configured_cadence_bins_raw_lateness_in_ms() -> None:
    r = ranking((key("a"), NOW - 3, False, None, "broken"))
    assert r.state(NOW + 59_999)["lateness"]["discovered"] == [0, 0, 0, 1, 0]  # 3 ms late: >= 2, < 4
    assert r.score_of(key("a"), NOW) == 3.0


# ------------------------------------------------------------------------- the merge vs the oracle

KEYS = [key(f"p{i}", d) for i in range(20) for d in ("desktop", "mobile")]
dues = st.one_of(
    st.none(), st.just(0), st.just(1), st.just(math.nan),
    st.sampled_from([NOW - h * HOUR_MS for h in (0, 1, 2, 6, 24)]),  # ties across classes, keys interleaved
    st.integers(-3 * 24 * 60, 60).map(lambda m: NOW + m * MINUTE_MS),  # many rows share a minute
    st.integers(-3 * DAY_MS, HOUR_MS).map(lambda ms: NOW + ms),  # and some are not minute-aligned
)
intervals = st.one_of(
    st.none(),
    st.sampled_from([0, -1, math.nan, "nonsense", "3600000", HOUR_MS, 6 * HOUR_MS, DAY_MS, 48 * HOUR_MS]),
    st.integers(1, 30 * DAY_MS),
    st.sampled_from([1e300, 3e15]),  # lateness edges no int64 window holds: the per-class path
)
rows_st = st.tuples(st.sampled_from(KEYS), dues, st.booleans(), intervals,
                    st.sampled_from([None, "catalog", "blog", "broken"]))


def oracle(r: Ranking, model: dict[str, tuple], k: int, now: int, leased: set[str]) -> list:
    return top_k_bruteforce(((kk, *v) for kk, v in model.items()), k, now, cadence_for=r._cadence_for,
                            boost=r._boost, is_leased=leased.__contains__)


@settings(max_examples=300, deadline=None)
@given(st.lists(rows_st, max_size=60), st.integers(0, 30), st.integers(0, 2 * MINUTE_MS),
       st.sets(st.sampled_from(KEYS)), st.sampled_from([1.0, 2.0, 3.5]))
def test_the_k_way_merge_equals_the_brute_force_oracle(
    rows: list[tuple], k: int, offset: int, leased: set[str], boost: float
) -> None:
    r = Ranking(cadence_for, boost=boost)
    model: dict[str, tuple] = {}
    for row in rows:
        r.upsert(*row)
        model[row[0]] = row[1:]
    now = NOW + offset
    expected = oracle(r, model, k, now, leased)
    got = r.top_k(k, now, leased.__contains__)
    assert got == [e[0] for e in expected]
    assert r.entries(got, now) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(rows_st, max_size=60), st.integers(0, 30), st.integers(0, 2 * MINUTE_MS),
       st.sets(st.sampled_from(KEYS)), st.sets(st.sampled_from([*KEYS, "absent|desktop"])))
def test_top_k_of_a_few_keys_equals_top_k_skipping_the_others_and_asks_only_about_them(
    rows: list[tuple], k: int, offset: int, leased: set[str], only: set[str]
) -> None:
    """A keeper fenced on all but a few keys ranks just those: the same answer as the full walk
    whose filter skips every other key, without asking the filter about any other key."""
    r = Ranking(cadence_for)
    for row in rows:
        r.upsert(*row)
    now = NOW + offset
    asked: list[str] = []

    def skipped(key: str) -> bool:
        asked.append(key)
        return key in leased

    expected = r.top_k(k, now, lambda key: key not in only or key in leased)
    assert r.top_k_of(only, k, now, skipped) == expected
    assert set(asked) <= only


def test_the_merge_equals_the_oracle_on_a_large_mixed_queue() -> None:
    # long runs within one class (galloping) and many cross-class ties on shared minutes
    rnd = random.Random(11)
    r = Ranking(cadence_for)
    model: dict[str, tuple] = {}
    for i in range(3000):
        row = (key(f"p{i}", rnd.choice(["desktop", "mobile"])),
               NOW - rnd.randrange(0, 3 * DAY_MS, rnd.choice([MINUTE_MS, HOUR_MS, 6 * HOUR_MS])),
               rnd.random() < 0.6, rnd.choice([None, HOUR_MS, 6 * HOUR_MS, DAY_MS, 0]),
               rnd.choice([None, "catalog", "blog"]))
        r.upsert(*row)
        model[row[0]] = row[1:]
    leased = set(rnd.sample(sorted(model), 200))
    for k in (1, 10, 100, 1000, 2500, 5000):
        for now in (NOW, NOW + 90_000, NOW - 3 * HOUR_MS):
            expected = oracle(r, model, k, now, leased)
            assert r.top_k(k, now, leased.__contains__) == [e[0] for e in expected]


@settings(max_examples=200, deadline=None)
@given(st.lists(rows_st, max_size=40), st.integers(-2 * DAY_MS, 2 * DAY_MS), st.sets(st.sampled_from(KEYS)))
def test_the_queue_state_equals_a_row_by_row_count(rows: list[tuple], shift: int, leased: set[str]) -> None:
    r = Ranking(cadence_for)
    for row in rows:
        r.upsert(*row)
    now = NOW + shift
    s = r.state(now, leased)
    expected = state_per_row(r, now, leased)
    assert (s["undated"], s["now"], s["coming"]) == (expected["undated"], expected["now"], expected["coming"])
    assert s["lateness"]["sitemap"] == expected["sitemap"]
    assert s["lateness"]["discovered"] == expected["discovered"]
    assert {k: v for k, v in s["lateness"]["byRoute"].items() if any(v)} == expected["byRoute"]
    assert (s["dueHistogram"]["bins"], s["dueHistogram"]["before"], s["dueHistogram"]["after"]) == (
        expected["bins"], expected["before"], expected["after"])
    assert sum(c["rows"] for c in s["classes"]) == s["held"] == len(r)


operations = st.lists(st.one_of(
    st.tuples(st.just("upsert"), rows_st),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("tick"), st.integers(-MINUTE_MS, 3 * MINUTE_MS)),
    st.tuples(st.just("config"),
              st.tuples(st.sampled_from([HOUR_MS, DAY_MS, 0]), st.sampled_from([1.0, 2.5]))),
    st.tuples(st.just("publish"), st.tuples(st.integers(0, 12), st.sets(st.sampled_from(KEYS), max_size=6))),
    # a store walk's batch: few dues and cadences, so keys often share a bucket, out of key order
    st.tuples(st.just("bulk"), st.lists(st.tuples(
        st.sampled_from(KEYS), st.sampled_from([None, NOW - HOUR_MS, NOW, NOW + MINUTE_MS]), st.booleans(),
        st.sampled_from([None, HOUR_MS])), max_size=16)),
), max_size=80)


def _same_state(r: Ranking, now: int, leased: set[str]) -> None:
    s = r.state(now, leased)
    expected = state_per_row(r, now, leased)
    assert (s["undated"], s["now"], s["coming"]) == (expected["undated"], expected["now"], expected["coming"])
    assert (s["lateness"]["sitemap"], s["lateness"]["discovered"]) == (expected["sitemap"], expected["discovered"])
    assert {k: v for k, v in s["lateness"]["byRoute"].items() if any(v)} == expected["byRoute"]
    assert (s["dueHistogram"]["bins"], s["dueHistogram"]["before"], s["dueHistogram"]["after"]) == (
        expected["bins"], expected["before"], expected["after"])
    assert sum(c["rows"] for c in s["classes"]) == s["held"] == len(r)
    oldest = sorted((min(c.buckets) if c.buckets else -1 for c in r._classes.values()))
    assert sorted(-1 if c["oldestDue"] is None else c["oldestDue"] for c in s["classes"]) == oldest


def route_by_url(k: str) -> str | None:
    """A route per URL, as upsert_many asks it (once per URL): the model must agree with it."""
    return (None, "catalog", "blog", "broken")[sum(map(ord, k.partition("|")[0])) % 4]


@settings(max_examples=200, deadline=None)
@given(operations)
def test_repeated_publishes_equal_the_oracle_through_any_sequence_of_changes(ops: list[tuple]) -> None:
    # top_k keeps its merge as a per-minute plan; every change in between must still be reflected
    r = Ranking(cadence_for)
    model: dict[str, tuple] = {}
    now = NOW
    for op, arg in ops:
        if op == "upsert":
            r.upsert(*arg)
            model[arg[0]] = arg[1:]
        elif op == "bulk":  # appends out of key order; sorted before the next read (or removal)
            assert r.upsert_many(arg, route_by_url) == len(arg)
            for row in arg:
                model[row[0]] = (*row[1:], route_by_url(row[0]))
        elif op == "remove":
            assert r.remove(arg) == (model.pop(arg, None) is not None)
        elif op == "tick":
            now += arg
        elif op == "config":
            default, boost = arg
            r.reclassify(partial(cadence_or, default), boost=boost)
        else:
            k, leased = arg
            assert r.top_k(k, now, leased.__contains__) == [e[0] for e in oracle(r, model, k, now, leased)]
    assert r.top_k(len(KEYS), now) == [e[0] for e in oracle(r, model, len(KEYS), now, set())]
    assert len(r) == len(model)
    buckets = [b for c in r._classes.values() for b in (*c.buckets.values(), c.undated) if b]
    assert all(list(b) == sorted(b) for b in buckets if id(b) not in r._unsorted)
    assert all(b.due is None or b.due > now for b in r._unsorted.values())  # a merge sorted the due ones
    assert sorted(row.key for row in r.rows()) == sorted(model)  # reading every row sorts the rest
    assert all(list(b) == sorted(b) for b in buckets) and not r._unsorted


def test_a_bulk_upsert_out_of_key_order_into_a_due_bucket_ranks_as_the_oracle_says() -> None:
    """A new sitemap's rows all land in one bucket due now, batch after batch out of key order: the
    bucket is sorted once before the next merge, not per row, and a plan already built is dropped."""
    r = Ranking(partial(cadence_or, DAY_MS))
    rows = [(key(f"p{i:04d}"), NOW, True, DAY_MS) for i in range(600)]
    batches = [rows[400:], rows[:200], rows[200:400]]  # each in order, the whole not
    r.upsert_many(batches[0], lambda k: None)
    assert r.top_k(3, NOW) == [k for k, *_ in rows[400:403]]  # a plan holding the bucket
    for batch in batches[1:]:
        r.upsert_many(batch, lambda k: None)
    held = [(k, d, s, i, None) for k, d, s, i in rows]
    expected = [k for k, *_ in top_k_bruteforce(held, 50, NOW, cadence_for=partial(cadence_or, DAY_MS))]
    assert r.top_k(50, NOW) == expected == [k for k, *_ in rows[:50]]
    assert r.remove(rows[10][0]) and r.top_k(50, NOW) == [k for k, *_ in rows[:10] + rows[11:51]]


@settings(max_examples=200, deadline=None)
@given(operations, st.integers(1, 4))
def test_the_kept_queue_state_counts_equal_a_row_by_row_count_through_any_sequence_of_changes(
        ops: list[tuple], every: int) -> None:
    # the counts are kept between documents (a snapshot and the changes since): any change in between,
    # a bucket emptied or made, a class gone, a bulk load, must show in the next document
    import prerender_ray.queue.row_classes as row_classes

    r = Ranking(cadence_for)
    now = NOW
    saved = row_classes.CHANGES_MIN
    row_classes.CHANGES_MIN = 3  # small: rebuilds happen inside the sequence too
    try:
        for i, (op, arg) in enumerate(ops):
            if op == "upsert":
                r.upsert(*arg)
            elif op == "bulk":
                r.upsert_many(arg, route_by_url)
            elif op == "remove":
                r.remove(arg)
            elif op == "tick":
                now += arg
            elif op == "config":
                r.reclassify(partial(cadence_or, arg[0]), boost=arg[1])
            else:
                r.top_k(arg[0], now, arg[1].__contains__)
            if i % every == 0:
                _same_state(r, now, set())
        _same_state(r, now, set())
    finally:
        row_classes.CHANGES_MIN = saved


def test_one_search_serves_every_class_and_a_junk_cadence_falls_back_exactly() -> None:
    r = Ranking(cadence_for)
    for i in range(200):
        r.upsert(key(f"p{i}"), NOW - (i % 50) * HOUR_MS, i % 2 == 0, (None, HOUR_MS, DAY_MS)[i % 3],
                 (None, "catalog", "blog")[i % 3])
    first = r.state(NOW)
    joint = r._joint
    assert joint is not None and len(joint.classes) == len(r._classes) > 3
    r.upsert(key("p0"), NOW + HOUR_MS, True, None, None)  # a change: the joint snapshot is kept
    assert r.state(NOW)["now"]["due"] == first["now"]["due"] - 1 and r._joint is joint
    expected = state_per_row(r, NOW, set())
    r.upsert(key("junk"), NOW - DAY_MS, False, 1e300, None)
    s = r.state(NOW)
    assert r._joint is None  # no window holds now - 4e300
    assert s["lateness"]["discovered"] == [a + b for a, b in zip(expected["discovered"], [1, 0, 0, 0, 0])]
    assert s["now"]["due"] == expected["now"]["due"] + 1

