"""The discovery budget (``bots.discovery``): a rate per site, a ceiling of unrendered discovered
targets per site, shares of it per owner, and no discovery from a claim that is not verified."""

from __future__ import annotations

from prerender_ray.config.loading import explain_discovery, parse
from prerender_ray.queue.discovery import (
    CEILING,
    FAILED_CLAIM,
    RATE,
    SITES,
    UNVERIFIED_CLAIM,
    RateBudget,
    Unrendered,
    share_of,
    site_of,
)
from prerender_ray.serving.bot_policy import FAILED, UNCHECKED, UNVERIFIED, VERIFIED, Policies
from prerender_ray.serving.bots import BotRegistry


def test_the_site_is_the_host_whatever_the_port_and_path() -> None:
    assert site_of("https://shop.test/a?b=1") == site_of("http://shop.test:8080/c") == "shop.test"
    assert site_of("https://[::1]:9/x") == "[::1]" and site_of("https://other.test/") == "other.test"


def test_the_rate_is_a_bucket_per_site_refilled_over_the_minute() -> None:
    rate = RateBudget(60)  # one a second, a minute's worth at once
    assert [rate.take("a.test", 0) for _ in range(60)] == [None] * 60
    assert rate.take("a.test", 0) == RATE
    assert rate.take("b.test", 0) is None  # another site has its own bucket
    assert rate.take("a.test", 999) == RATE and rate.take("a.test", 1_000) is None
    assert rate.take("a.test", 1_000) == RATE  # a second's refill is one token, refused takes included
    assert [rate.take("a.test", 3_600_000) for _ in range(61)].count(None) == 60  # never more than the burst


def test_a_rate_split_over_replicas_still_grants_one_and_zero_grants_none() -> None:
    assert RateBudget(60 / 32).take("a.test", 0) is None
    assert RateBudget(0).take("a.test", 0) == RATE


def test_sites_tracked_for_the_rate_are_bounded() -> None:
    rate = RateBudget(60, max_sites=2)
    assert rate.take("a.test", 0) is None and rate.take("b.test", 0) is None
    assert rate.take("c.test", 0) == SITES and len(rate) == 2  # refused before a bucket is made
    assert rate.take("c.test", 60_000) is None and len(rate) == 1  # the refilled buckets were forgotten


def test_the_ceiling_counts_unrendered_discoveries_per_site() -> None:
    u = Unrendered()
    assert [u.admit(f"https://a.test/{i}", 3, 0) for i in range(3)] == [None] * 3
    assert u.admit("https://a.test/3", 3, 0) == CEILING
    assert u.admit("https://a.test/1", 3, 0) is None  # a URL counted already costs nothing more
    assert u.admit("https://b.test/0", 3, 0) is None  # another site
    assert u.release("https://a.test/0") and not u.release("https://a.test/0")
    assert u.admit("https://a.test/3", 3, 0) is None  # a result came: room again
    assert (u.count("a.test"), len(u)) == (3, 4)
    report = u.report(3)
    assert report["spent"] == ["a.test"] and report["sites"] == {"a.test": 3, "b.test": 1}
    assert report["unrenderedPerSite"] == 3 and report["unrendered"] == 4


def test_a_sweep_forgets_urls_whose_rows_left_and_runs_at_most_once_a_second() -> None:
    u = Unrendered()
    for i in range(3):
        u.admit(f"https://a.test/{i}", 3, 0)
    assert u.sweep_due("a.test", 10_000) and not u.sweep_due("a.test", 10_500)
    assert u.sweep("a.test", lambda url: url.endswith("/1")) == 2
    assert u.count("a.test") == 1 and u.sweep_due("a.test", 11_000)


def test_what_one_keeper_counts_is_bounded_in_sites_and_urls() -> None:
    u = Unrendered(max_sites=2, max_held=3)
    assert u.admit("https://a.test/1", 10, 0) is None and u.admit("https://b.test/1", 10, 0) is None
    assert u.admit("https://c.test/1", 10, 0) == SITES
    assert u.admit("https://a.test/2", 10, 0) is None and u.admit("https://a.test/3", 10, 0) == SITES
    assert Unrendered().admit("https://a.test/1", 0, 0) == CEILING  # 0: no discovery at all


def test_each_owner_holds_a_share_and_the_shares_stay_within_the_ceiling() -> None:
    assert share_of(1_000, 1) == 1_000 and share_of(1_000, 3) == 334 and share_of(0, 3) == 0
    for nodes in range(1, 40):
        assert 1_000 <= share_of(1_000, nodes) * nodes <= 1_000 + nodes - 1


def test_a_claim_not_verified_never_discovers_whatever_its_policy() -> None:
    cfg = parse({"bots": {"default": {"serve": "prerender", "discover": True},
                          "classes": {"other": {"serve": "origin", "discover": True}}}}).config
    p = Policies(cfg.bots, BotRegistry())
    for state in (UNCHECKED, VERIFIED):
        d = p.decide("Googlebot", state)
        assert (d.discover, d.withheld) == (True, "")
    failed, unverified = p.decide("Googlebot", FAILED), p.decide("Googlebot", UNVERIFIED)
    assert (failed.discover, failed.withheld, failed.serve) == (False, FAILED_CLAIM, "origin")
    assert (unverified.discover, unverified.withheld, unverified.serve) == (False, UNVERIFIED_CLAIM, "prerender")
    off = Policies(parse({"bots": {"default": {"discover": False}}}).config.bots, BotRegistry())
    assert off.decide("SomeBot", FAILED).withheld == ""  # the policy said no already: nothing withheld


def test_the_defaults_and_what_config_check_says() -> None:
    budget = parse({}).config.bots.discovery
    assert (budget.per_minute, budget.max_unrendered) == (60, 1_000)
    lines = explain_discovery(parse({"server": {"replicas": 4},
                                     "bots": {"discovery": {"perMinute": 120, "maxUnrendered": 500}}}).config)
    text = "\n".join(lines)
    assert "120 new targets per site and minute on each node (30 per ingress replica, 4 replicas)" in text
    assert "500 discovered targets per site" in text and "failed or is not verified yet" in text
    off = "\n".join(explain_discovery(parse({"bots": {"discovery": {"perMinute": 0}}}).config))
    assert "off" in off
