"""Bot names: the registry, its boundary rule, derivation for unregistered crawlers, the memo."""

from __future__ import annotations

import pytest

from prerender_ray.config.loading import parse
from prerender_ray.serving.bots import (
    DEFAULT_BOTS,
    MAX_AGENT_CHARS,
    OTHER,
    BotEntry,
    BotRegistry,
    derive_bot_name,
)

REGISTRY = BotRegistry()
BARE = BotRegistry([])  # every name below comes from derivation itself


def test_the_default_registry_has_about_fifty_entries_with_names_and_matches() -> None:
    assert 46 <= len(DEFAULT_BOTS) <= 80
    assert all(e.name and e.match == e.match.lower() for e in DEFAULT_BOTS)


@pytest.mark.parametrize(
    ("ua", "name"),
    [
        ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "Googlebot"),
        ("Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)", "Bingbot"),
        ("GPTBot/1.0", "GPTBot"),
        ("Googlebot-Image/1.0", "Googlebot-Image"),
        ("GoogleOther", "GoogleOther"),
        ("GoogleOther-Image/1.0", "GoogleOther-Image"),
        (("Mozilla/5.0 (X11; Linux x86_64; Storebot-Google/1.0) AppleWebKit/537.36 (KHTML, like Gecko) "
         "Chrome/W.X.Y.Z Safari/537.36"), "Storebot-Google"),
        ("Mozilla/5.0 (compatible; SeznamBot/4.0; +http://napoveda.seznam.cz/seznambot-intro/)", "SeznamBot"),
        ("Mozilla/5.0 (compatible; Yeti/1.1; +https://naver.me/spd)", "Naver Yeti"),
        (("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0; "
          "+claudebot@anthropic.com)"),
         "ClaudeBot"),
        ("Mozilla/5.0 (compatible; OAI-SearchBot/1.0; +https://openai.com/searchbot)", "OAI-SearchBot"),
        ("Mozilla/5.0 (compatible; PerplexityBot/1.0; +https://perplexity.ai/bot)", "PerplexityBot"),
        ("CCBot/2.0 (https://commoncrawl.org/faq/)", "CCBot"),
        (("Mozilla/5.0 (Linux; Android 5.0) AppleWebKit/537.36 (KHTML, like Gecko) Mobile Safari/537.36 "
         "(compatible; Bytespider; spider-feedback@bytedance.com)"), "Bytespider"),
        ("meta-externalagent/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/crawler)",
         "Meta-ExternalAgent"),
        ("Mozilla/5.0 (compatible; MJ12bot/v1.4.8; http://mj12bot.com/)", "MJ12bot"),
        ("rogerbot/1.2 (https://moz.com/help/, rogerbot-crawler@moz.com)", "Rogerbot"),
        ("Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)", "AhrefsBot"),
        ("Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)", "SemrushBot"),
        ("Screaming Frog SEO Spider/21.4", "Screaming Frog"),
        ("DuckDuckBot/1.0; (+http://duckduckgo.com/duckduckbot.html)", "DuckDuckBot"),
        ("Mozilla/5.0 (compatible; DuckDuckBot-Https/1.1; https://duckduckgo.com/bot)", "DuckDuckBot"),
        (("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) "
         "Version/13.1.1 Safari/605.1.15 (Applebot/0.1; +http://www.apple.com/go/applebot)"), "Applebot"),
        ("Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)", "YandexBot"),
        ("Mozilla/5.0 (compatible; Baiduspider/2.0; +http://www.baidu.com/spider.html)", "Baidu Spider"),
        ("facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)", "facebookexternalhit"),
        ("Twitterbot/1.0", "Twitterbot"),
        ("LinkedInBot/1.0 (compatible; Mozilla/5.0; Apache-HttpClient +http://linkedin.com)", "LinkedInBot"),
        ("Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)", "Slackbot"),
        ("Slackbot 1.0 (+https://api.slack.com/robots)", "Slackbot"),
    ],
)
def test_the_default_registry_names_known_crawlers(ua: str, name: str) -> None:
    assert REGISTRY.name(ua) == name


def test_the_match_is_case_insensitive() -> None:
    assert REGISTRY.name("GOOGLEBOT/2.1") == "Googlebot"


def test_a_match_needs_a_trailing_boundary() -> None:
    # `googleother` cannot cross the hyphen of an unregistered variant...
    registry = BotRegistry([{"name": "GoogleOther", "match": "googleother"}], derive_unknown=False)
    assert registry.name("GoogleOther-Audio/1.0") == "other"
    for tail in ("/1.0", ";", ")", " x", "\tx", ""):
        assert registry.name("GoogleOther" + tail) == "GoogleOther"


def test_there_is_no_leading_boundary() -> None:
    assert REGISTRY.name("Spaghettiyeti/1") == "Naver Yeti"


def test_the_leftmost_match_wins_then_the_longest_at_that_position() -> None:
    registry = BotRegistry([BotEntry("Short", "abc"), BotEntry("Long", "abc-def"), BotEntry("Later", "xyz")])
    assert registry.name("xyz/1 abc-def/2") == "Later"
    assert registry.name("abc-def/2 xyz/1") == "Long"


def test_a_later_entry_wins_a_shared_match_string() -> None:
    registry = BotRegistry([{"name": "First", "match": "dup"}, {"name": "Second", "match": "DUP"}])
    assert registry.name("dup/1") == "Second"


def test_entries_without_a_name_or_a_match_are_discarded() -> None:
    registry = BotRegistry([{"name": 3, "match": "x"}, {"name": "Y", "match": ""}, {"match": "z"}, None, 42,
                            {"name": "Ok", "match": "okbot"}], derive_unknown=False)
    assert registry.name("okbot/1") == "Ok"
    assert registry.name("x/1") == "other"
    assert registry.name("z/1") == "other"


def test_no_user_agent_is_other_and_the_debug_marker_is_debug() -> None:
    assert REGISTRY.name(None) == "other"
    assert REGISTRY.name("") == "other"
    assert REGISTRY.name_for({}) == "other"
    assert REGISTRY.name_for({"harper": "pre-render", "user-agent": "Googlebot/2.1"}) == "debug"
    assert REGISTRY.name_for({"user-agent": "Googlebot/2.1"}) == "Googlebot"


def test_a_configured_registry_replaces_the_defaults() -> None:
    cfg = parse({"analytics": {"bots": [{"name": "MyBot", "match": "mybot"}]}}).config
    registry = BotRegistry.from_config(cfg)
    assert registry.name("MyBot/3.0 (+https://example.com)") == "MyBot"
    # Googlebot left the registry; derivation still labels it with what the UA declares.
    assert registry.name("Googlebot/2.1") == "Googlebot"
    assert registry.name("Mozilla/5.0 (compatible; bingbot/2.0)") == "bingbot"


def test_the_config_default_is_the_built_in_registry() -> None:
    registry = BotRegistry.from_config(parse({}).config)
    assert registry.name("Mozilla/5.0 (compatible; bingbot/2.0)") == "Bingbot"


def test_the_memo_is_bounded() -> None:
    registry = BotRegistry(memo_size=8)
    for i in range(50):
        registry.name(f"Crawler{i}/1.0")
    info = registry._memo.cache_info()
    assert info.maxsize == 8 and info.currsize == 8


# ----------------------------------------------------------------------------------- derivation


@pytest.mark.parametrize(
    ("ua", "name"),
    [
        ("Mozilla/5.0 (compatible; ExampleBot/2.1; +https://example.com/bot)", "ExampleBot"),
        ("Mozilla/5.0 (compatible; Barkrowler/0.9; +https://example.com/crawler)", "Barkrowler"),
        ("Mozilla/5.0 (compatible; NewSpider; spider-feedback@example.com)", "NewSpider"),
        ("UnknownCrawler/1.0 (+https://example.com)", "UnknownCrawler"),
        ("facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)", "facebookexternalhit"),
        ("Acme Site Auditor/3.2 (contact@example.com)", "Acme Site Auditor"),
        ("Sogou web spider/4.0(+http://www.example.com/docs.htm#07)", "Sogou web spider"),
        (("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
          "Version/17.4 Safari/605.1.15 (NewsReaderBot/0.1; +http://example.com/bot)"), "NewsReaderBot"),
        ("Mozilla/5.0 (compatible; Linkfluence v2.1)", "Linkfluence"),
    ],
)
def test_an_unregistered_crawler_is_named_after_what_its_ua_declares(ua: str, name: str) -> None:
    assert BARE.name(ua) == name


@pytest.mark.parametrize(
    "ua",
    [
        ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 "
        "Safari/537.36 Edg/126.0.0.0"),
        ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/17.5 Mobile/15E148 Safari/604.1"),
        ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/23.0 "
        "Chrome/115.0.0.0 Mobile Safari/537.36"),
        "Mozilla/5.0 (compatible; MSIE 10.0; Windows NT 6.1; Trident/6.0)",
        "Opera/9.80 (Windows NT 6.0) Presto/2.12.388 Version/12.14",
    ],
)
def test_a_browser_user_agent_is_never_given_a_bot_name(ua: str) -> None:
    assert BARE.name(ua) == "other"


def test_a_bare_keyword_or_a_url_never_becomes_a_name() -> None:
    assert BARE.name("Mozilla/5.0 (compatible; Bot/1.0)") == "other"
    assert BARE.name("Mozilla/5.0 (+http://www.example.com/bot.html)") == "other"
    assert derive_bot_name("robots") is None


def test_a_registry_match_wins_over_derivation() -> None:
    registry = BotRegistry([{"name": "Nice Name", "match": "uglytokenbot"}])
    assert registry.name("UglyTokenBot/1.0 (+https://example.com)") == "Nice Name"


def test_derivation_can_be_turned_off() -> None:
    cfg = parse({"analytics": {"deriveUnknownBots": False}}).config
    assert BotRegistry.from_config(cfg).name("ExampleBot/2.1 (+https://example.com/bot)") == "other"


# ---------------------------------------------------------------------------------------- classes


@pytest.mark.parametrize(("name", "cls"), [
    ("Googlebot", "search"), ("Bingbot", "search"), ("Applebot", "search"),
    ("OAI-SearchBot", "ai-search"), ("ChatGPT-User", "ai-search"), ("Claude-SearchBot", "ai-search"),
    ("Claude-User", "ai-search"), ("PerplexityBot", "ai-search"), ("Perplexity-User", "ai-search"),
    ("GPTBot", "ai-training"), ("ClaudeBot", "ai-training"), ("CCBot", "ai-training"),
    ("Meta-ExternalAgent", "ai-training"), ("facebookexternalhit", "social"), ("Slackbot", "social"),
    ("AhrefsBot", "seo-tool"), ("GoogleOther", "other"), ("other", "other"), ("debug", "other"),
    ("SomeDerivedBot", "other"),
])
def test_every_name_has_a_class(name: str, cls: str) -> None:
    assert REGISTRY.class_of(name) == cls


def test_every_default_entry_names_a_known_class() -> None:
    from prerender_ray.serving.bots import BOT_CLASSES

    assert all(e.bot_class in BOT_CLASSES for e in DEFAULT_BOTS)
    assert {e.bot_class for e in DEFAULT_BOTS} == set(BOT_CLASSES)


def test_a_replaced_registry_keeps_built_in_classes_and_takes_its_own() -> None:
    cfg = parse({"analytics": {"bots": [{"name": "Googlebot", "match": "googlebot"},
                                        {"name": "MyBot", "match": "mybot", "botClass": "ai-search"},
                                        {"name": "GPTBot", "match": "gptbot", "botClass": "other"}]}}).config
    registry = BotRegistry.from_config(cfg)
    assert registry.class_of("Googlebot") == "search"
    assert registry.class_of("MyBot") == "ai-search"
    assert registry.class_of("GPTBot") == "other"  # the operator's class wins over the built-in one


def test_a_user_agent_is_named_from_its_first_1024_characters() -> None:
    registry = BotRegistry()
    long = "Mozilla/5.0 (compatible; Googlebot/2.1) " + "x" * 80_000  # longer than a head may be (64 KiB)
    assert registry.name(long) == "Googlebot"
    assert registry.name("x" * MAX_AGENT_CHARS + " Googlebot/2.1") == OTHER  # past the part read
    keys = registry._memo.cache_parameters()
    assert keys["maxsize"] == 1000 and registry._memo.cache_info().currsize == 2
