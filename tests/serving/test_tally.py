"""Bounded analytics tallies: the unrouted report (docs/serving.md#unrouted-tally) and label budgets."""

from __future__ import annotations

from prerender_ray.serving.tally import LABEL_OVERFLOW, MAX_SAMPLE_PATH, OVERFLOW, LabelBudget, UnroutedTally


def test_a_label_budget_admits_the_first_values_then_folds_the_rest() -> None:
    budget = LabelBudget(2)
    assert [budget(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", LABEL_OVERFLOW, "a", LABEL_OVERFLOW, "b"]


def test_unrouted_buckets_count_per_class_with_first_sample_and_times() -> None:
    t = UnroutedTally(max_buckets=10)
    assert t.record("unclassified", "/help/contact", 1) == "/help/*"
    assert t.record("unclassified", "/help/faq", 5) == "/help/*"
    assert t.record("passthrough", "/foo", 2) == "/foo"
    assert t.record("unclassified", "/", 3) == "/"
    assert t.record("prerender", "/x", 4) is None  # never tallied
    b = t.peek()["unclassified"].buckets["/help/*"]
    assert (b.count, b.first_ms, b.last_ms, b.sample_path) == (2, 1, 5, "/help/contact")
    assert t.record("unclassified", "/x/y", 6, source="redirect") == "/x/* (redirect)"


def test_buckets_past_the_cap_only_count_as_overflow_and_labels_stay_bounded() -> None:
    t = UnroutedTally(max_buckets=2)
    labels = [t.record("unclassified", f"/s{i}/x", i) for i in range(5)]
    assert labels == ["/s0/*", "/s1/*", OVERFLOW, OVERFLOW, OVERFLOW]
    assert t.peek()["unclassified"].overflowed == 3 and len(t.peek()["unclassified"].buckets) == 2
    assert t.record("unclassified", "/s0/again", 9) == "/s0/*"  # known buckets keep counting


def test_draining_resets_and_reports_top_buckets_by_count() -> None:
    t = UnroutedTally(max_buckets=1, top_n=1)
    for path in ("/a/1", "/a/2", "/b"):
        t.record("unclassified", path, 0)
    lines = t.lines(t.drain())
    assert lines[0].startswith("unclassified: 2 request(s) served without prerendering across 1 path bucket(s)")
    assert "/a/* x2 (e.g. /a/1)" in lines[0]
    assert "1 request(s) in new path buckets past the cap of 1" in lines[1]
    assert t.peek() == {} and t.lines(t.drain()) == []


# ------------------------------------------------------------------------------------ bot misses


def test_missed_urls_are_kept_per_class_most_asked_first_and_bounded() -> None:
    from prerender_ray.serving.tally import MAX_MISS_URL, MissTally

    t = MissTally(max_urls=3)
    for i, url in enumerate(["a", "b", "a", "c", "a", "b"]):
        t.record("ai-search", f"https://x.example/{url}", "OAI-SearchBot", i)
    t.record("search", "https://x.example/a", "Googlebot", 9)
    top = t.top(10)
    assert [(r["url"][-1], r["count"]) for r in top["ai-search"]] == [("a", 3), ("b", 2), ("c", 1)]
    assert top["search"][0]["lastBot"] == "Googlebot"
    t.record("ai-search", "https://x.example/d", "ChatGPT-User", 10)  # full: the least recent (c) goes
    assert [r["url"][-1] for r in t.top(10)["ai-search"]] == ["a", "b", "d"] and t.evicted == 1
    assert len(t.top(2)["ai-search"]) == 2
    t.record("other", "https://x.example/" + "x" * 10_000, "other", 11)
    assert len(t.top(1)["other"][0]["url"]) == MAX_MISS_URL
    off = MissTally(0)
    off.record("other", "https://x.example/", "other", 1)
    assert off.top(5) == {}


def test_junk_first_segments_fold_into_overflow_without_spending_the_label_budget() -> None:
    # Before: each 8,000-character segment was a bucket and a label of its own, so 200 of them put
    # 1.6 MB of a client's text in /metrics per class and every genuine bucket after read overflow.
    from prerender_ray.serving.origin_rules import MAX_BUCKET_SEGMENT

    t = UnroutedTally(max_buckets=200)
    labels = [t.record("passthrough", f"/{i:04d}{'x' * 7_996}/y", i) for i in range(200)]
    labels += [t.record("passthrough", f"/a\u00e9b{i}", i) for i in range(10)]  # not a canonical URL's
    assert set(labels) == {OVERFLOW} and t.peek()["passthrough"].overflowed == 210
    assert t.record("passthrough", "/blog/x", 1) == "/blog/*"
    assert t.record("passthrough", f"/{'s' * MAX_BUCKET_SEGMENT}", 1) == f"/{'s' * MAX_BUCKET_SEGMENT}"
    labels = [t.record("passthrough", f"/b{i}/" + "z" * 8_000, i) for i in range(300)]
    assert all(len(label) <= MAX_BUCKET_SEGMENT + 3 for label in labels)
    assert all(len(b.sample_path) <= MAX_SAMPLE_PATH for b in t.peek()["passthrough"].buckets.values())
