"""robots.txt, pure: the cut, decoding, Sitemap: lines, outcomes, the last good copy and the table of
bots a policy serves although robots.txt disallows them."""

from __future__ import annotations

import os

import pytest

from prerender_ray.config.model import Config
from prerender_ray.serving.bots import DEFAULT_BOTS
from prerender_ray.serving.origin_policy import OriginPolicy
from prerender_ray.sitemaps.robots import (
    MAX_GROUPS,
    MAX_IGNORED,
    OK,
    UNAVAILABLE,
    UNREACHABLE,
    Conflict,
    ParsedRobots,
    check_file,
    configured_origins,
    cut,
    disallowed,
    origin_for,
    report,
    robots_token,
    served_today,
    settle,
    sitemap_lines,
)
from prerender_ray.sitemaps.rules import SAMPLE_TEXT

KIB = 1024
URL = "https://shop.test/robots.txt"


def parsed(text: str | bytes, max_bytes: int = 500 * KIB) -> ParsedRobots:
    body = text.encode() if isinstance(text, str) else text
    return ParsedRobots.from_body(URL, body, max_bytes=max_bytes, fetched_at=1)


def policy(*domains: str) -> OriginPolicy:
    return OriginPolicy(Config.model_validate({"domains": list(domains)}))


# ---------------------------------------------------------------------------------------- the cut


def test_a_50_mb_robots_txt_is_parsed_up_to_the_cut_only() -> None:
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# " + b"x" * 97 + b"\n"
    body = head + filler * (50 * 1024 * 1024 // len(filler)) + b"User-agent: GPTBot\nDisallow: /\n"
    r = parsed(body)
    assert r.truncated and r.size <= 500 * KIB
    assert r.allows("GPTBot", "/early/x") is False  # the rule before the cut holds
    assert r.allows("GPTBot", "/") is True  # the group after the cut was never read


def test_a_cut_drops_the_partial_last_line() -> None:
    body = b"User-agent: *\nDisallow: /private-area\n"
    data, truncated = cut(body, len(b"User-agent: *\nDisallow: /pri"))
    assert truncated and data == b"User-agent: *\n"
    # Parsed whole, the half line would be a rule that disallows far more than the file says.
    r = parsed(body, max_bytes=len(b"User-agent: *\nDisallow: /pri"))
    assert r.allows("Googlebot", "/pricing") is True


def test_binary_garbage_parses_to_no_rules() -> None:
    r = parsed(os.urandom(200 * KIB) + b"\x00\xff\xfe")
    assert r.state == OK and r.allows("Googlebot", "/") is True
    assert r.summary(None, 10)["groups"] == [] and r.sitemaps == []


def test_non_utf8_bytes_are_replaced_and_a_bom_is_not_part_of_the_first_line() -> None:
    r = parsed(b"\xef\xbb\xbfUser-agent: *\nDisallow: /caf\xe9\nDisallow: /x\n")
    assert r.allows("Googlebot", "/x") is False  # the BOM did not swallow the first group
    assert r.summary(None, 10)["groups"] == [{"userAgents": ["*"], "allow": 0, "disallow": 2}]


def test_groups_are_listed_in_file_order_and_bounded() -> None:
    text = "Sitemap: https://shop.test/s.xml\nUser-agent: a\nUser-agent: b\nAllow: /\nDisallow: /x\n"
    text += "".join(f"User-agent: bot{i}\nDisallow: /\n" for i in range(MAX_GROUPS + 50))
    summary = parsed(text).summary(None, 10)
    assert summary["groups"][0] == {"userAgents": ["a", "b"], "allow": 1, "disallow": 1}
    assert len(summary["groups"]) == MAX_GROUPS and summary["groupCount"] == MAX_GROUPS + 51


# ------------------------------------------------------------------------------------ Sitemap: lines


def test_a_10000_line_sitemap_list_is_bounded_and_foreign_hosts_are_ignored_and_reported() -> None:
    lines = [f"https://shop.test/s{i}.xml" for i in range(10_000)]
    lines[1:1] = ["https://evil.test/s.xml", "/relative.xml", "https://shop.test/s0.xml"]
    found = sitemap_lines(lines, policy("shop.test"), 50)
    assert found.urls == [f"https://shop.test/s{i}.xml" for i in range(50)]
    assert found.over_limit == 10_000 - 50 and found.total == 10_003
    assert found.ignored_count == 2 and {i["url"] for i in found.ignored} == {"https://evil.test/s.xml",
                                                                              "/relative.xml"}
    assert "not allowed by domains" in found.ignored[0]["reason"]


def test_ignored_lines_are_listed_up_to_a_bound_and_counted_beyond() -> None:
    found = sitemap_lines([f"https://evil{i}.test/s.xml" for i in range(500)], policy("shop.test"), 50)
    assert found.urls == [] and len(found.ignored) == MAX_IGNORED and found.ignored_count == 500


def test_an_ignored_line_is_listed_clipped_as_every_sample() -> None:
    long = "https://evil.test/" + "s" * 100_000
    far = "https://" + "h" * 8000 + ".test/s.xml"  # a valid URL whose host the refusal names twice
    found = sitemap_lines([long, far], policy("shop.test"), 50)
    assert found.ignored_count == 2
    assert [i["url"] for i in found.ignored] == [long[:SAMPLE_TEXT] + f"… ({len(long)} characters)",
                                                 far[:SAMPLE_TEXT] + f"… ({len(far)} characters)"]
    assert found.ignored[1]["reason"].startswith("h" * 100) and found.ignored[1]["reason"].endswith("characters)")
    assert all(len(i["reason"]) < 2 * SAMPLE_TEXT for i in found.ignored)


def test_the_summary_reports_sitemaps_as_walked_and_as_ignored() -> None:
    r = parsed("Sitemap: https://shop.test/a.xml\nSitemap: https://cdn.test/b.xml\nUser-agent: *\nAllow: /\n")
    s = r.summary(policy("shop.test"), 10)
    assert s["sitemaps"] == ["https://shop.test/a.xml"] and s["sitemapsIgnoredCount"] == 1
    assert (s["state"], s["status"], s["size"], s["truncated"]) == (OK, 200, r.size, False)


# ------------------------------------------------------------------------------ outcomes and copies


def test_unavailable_allows_all_and_unreachable_knows_nothing() -> None:
    assert ParsedRobots(URL, UNAVAILABLE, 404).allows("GPTBot", "/") is True
    unknown = ParsedRobots(URL, UNREACHABLE, 503)
    assert unknown.allows("GPTBot", "/") is None and unknown.sitemaps == []
    assert disallowed(unknown, {"GPTBot": "prerender"}) == []


def test_an_unreachable_robots_txt_keeps_the_last_good_copy() -> None:
    good = parsed("User-agent: GPTBot\nDisallow: /\n")
    down = ParsedRobots(URL, UNREACHABLE, 503, fetched_at=2, error="503 Service Unavailable")
    kept = settle(good, down)
    assert kept.state == OK and kept.allows("GPTBot", "/") is False
    assert kept.extra["lastAttempt"] == {"at": 2, "status": 503, "error": "503 Service Unavailable"}
    assert settle(None, down) is down
    gone = ParsedRobots(URL, UNAVAILABLE, 404, fetched_at=3)
    assert settle(good, gone) is gone  # a 404 is an answer: allow all from now on


def test_a_row_round_trips_and_a_bad_row_knows_nothing() -> None:
    good = parsed("User-agent: GPTBot\nDisallow: /\n")
    again = ParsedRobots.from_row(good.to_row())
    assert again.allows("GPTBot", "/") is False and again.size == good.size
    assert ParsedRobots.from_row({"state": "bogus", "text": 5}).rules is None


# ---------------------------------------------------------------------------------------- conflicts

ROBOTS = """
User-agent: *
Disallow: /private/

User-agent: Googlebot
Allow: /

User-agent: GPTBot
User-agent: CCBot
Disallow: /

User-agent: ClaudeBot
Disallow: /shop/
Allow: /shop/public/
"""


@pytest.mark.parametrize("bot,mode,path,conflict", [
    ("GPTBot", "prerender", "/", True),
    ("CCBot", "origin", "/", True),  # served from the origin is still served
    ("GPTBot", "deny", "/", False),  # denied: the policy agrees with robots.txt
    ("Googlebot", "prerender", "/private/x", False),  # its own group allows all
    ("Googlebot-Image", "prerender", "/private/x", False),  # falls back to Googlebot's group
    ("Bingbot", "prerender", "/private/x", True),  # the * group
    ("Bingbot", "prerender", "/", False),
    ("ClaudeBot", "prerender", "/shop/a", True),
    ("ClaudeBot", "prerender", "/shop/public/a", False),  # the longest rule wins
    ("ClaudeBot", "prerender", "/private/x", False),  # its own group replaces *
])
def test_the_conflict_table(bot: str, mode: str, path: str, conflict: bool) -> None:
    found = disallowed(parsed(ROBOTS), {bot: mode}, (path,))
    assert found == ([Conflict(bot, mode, path)] if conflict else [])


def test_every_bot_served_today_is_checked_with_its_robots_token() -> None:
    served = served_today(b.name for b in DEFAULT_BOTS)
    assert set(served.values()) == {"prerender"}
    assert {"Googlebot", "GPTBot", "ClaudeBot", "CCBot", "Baiduspider", "Yeti"} <= set(served)
    assert robots_token("Google InspectionTool") == "Googlebot"
    doc = report(parsed("User-agent: *\nDisallow: /\nUser-agent: Googlebot\nAllow: /\n"), None, 10, served)
    bots = {c["bot"] for c in doc["conflicts"]}
    assert "GPTBot" in bots and "Googlebot" not in bots and "Googlebot-Image" not in bots
    assert doc["rulesKnown"] is True
    gpt = next(c for c in doc["conflicts"] if c["bot"] == "GPTBot")
    assert gpt["message"] == "robots.txt disallows / to GPTBot, but the policy serves it (prerender)"


# ---------------------------------------------------------------------------------------- origins


@pytest.mark.parametrize("domain,origin", [
    ("shop.test", "https://shop.test"), ("SHOP.test:443", "https://shop.test"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"), ("http://shop.test:80/", "http://shop.test"),
    ("[::1]:81", "https://[::1]:81"),
])
def test_a_domain_names_one_origin(domain: str, origin: str) -> None:
    assert origin_for(domain, "https") == origin


@pytest.mark.parametrize("domain", ["", "a b", "ftp://shop.test", "https://shop.test/robots.txt",
                                    "http://u@shop.test", "shop.test?x", "x" * 400])
def test_a_bad_domain_is_refused(domain: str) -> None:
    with pytest.raises(ValueError):
        origin_for(domain, "https")


def test_configured_origins_one_per_entry() -> None:
    assert configured_origins(["shop.test", "a.test:*", "b.test:8080", "shop.test"], "https") == [
        "https://shop.test", "https://a.test", "https://b.test:8080"]


def test_config_check_reads_a_saved_file_to_the_cut() -> None:
    cfg = Config.model_validate({"analytics": {"bots": [{"name": "GPTBot", "match": "gptbot"},
                                                        {"name": "Naver Yeti", "match": "yeti"}]},
                                 "robots": {"maxBytes": 1024}})
    body = b"User-agent: Yeti\nDisallow: /\n" + b"#" * 2000 + b"\nUser-agent: GPTBot\nDisallow: /\n"
    assert check_file(cfg, body, "r.txt") == [
        "warn: robots.txt r.txt: read up to 29 bytes only (robots.maxBytes)",
        "warn: robots.txt r.txt: robots.txt disallows / to Yeti, but the policy serves it (prerender)"]


def test_the_conflicts_follow_the_bot_policy() -> None:
    """A class denied is no conflict (robots.txt and the policy agree); one served is."""
    from prerender_ray.config.loading import parse
    from prerender_ray.sitemaps.robots import served_by

    cfg = parse({"domains": ["shop.test"], "bots": {"classes": {"ai-training": {"serve": "deny"}},
                                                   "named": {"CCBot": {"serve": "origin"}}}}).config
    served = served_by(cfg)
    assert served["GPTBot"] == "deny" and served["ClaudeBot"] == "deny" and served["CCBot"] == "origin"
    assert served["Googlebot"] == "prerender" and served["OAI-SearchBot"] == "prerender"
