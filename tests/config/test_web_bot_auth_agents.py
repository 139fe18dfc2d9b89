"""``bots.webBotAuth.agents``: origins only, https (http on a loopback host, for tests and local agents),
spelled one way so a header's agent matches its entry."""

from __future__ import annotations

import pytest

from prerender_ray.config.loading import ConfigError, parse


def agents(*entries: str) -> list[str]:
    return [a.origin for a in parse({"bots": {"webBotAuth": {"agents": list(entries)}}}).config.bots.web_bot_auth.agents]


def test_the_default_is_off() -> None:
    assert parse({}).config.bots.web_bot_auth.agents == []


def test_entries_are_origins_spelled_one_way() -> None:
    assert agents("https://ChatGPT.com/", "https://a.test:443", "https://a.test:8443", "http://127.0.0.1:9000",
                  "http://[::1]:80") == ["https://chatgpt.com", "https://a.test", "https://a.test:8443",
                                         "http://127.0.0.1:9000", "http://[::1]"]


@pytest.mark.parametrize("entry", ["http://chatgpt.com", "https://a.test/keys", "https://a.test/?x=1",
                                   "https://user:pw@a.test", "ftp://a.test", "chatgpt.com", "https://a.test:99999",
                                   "https://"])
def test_anything_but_an_origin_is_refused(entry) -> None:
    with pytest.raises(ConfigError, match="signature agent"):
        agents(entry)


def test_the_list_is_bounded() -> None:
    with pytest.raises(ConfigError, match="at most 64"):
        agents(*(f"https://a{i}.test" for i in range(65)))


def test_an_entry_may_name_the_bots_its_signature_verifies() -> None:
    found = parse({"bots": {"webBotAuth": {"agents": [
        "https://any.test", {"origin": "https://ChatGPT.com/", "bots": ["ChatGPT-User", "OAI-SearchBot"]}]}}})
    plain, named = found.config.bots.web_bot_auth.agents
    assert (plain.origin, plain.bots) == ("https://any.test", None)
    assert (named.origin, named.bots) == ("https://chatgpt.com", ["ChatGPT-User", "OAI-SearchBot"])
    with pytest.raises(ConfigError, match="signature agent"):
        parse({"bots": {"webBotAuth": {"agents": [{"origin": "http://chatgpt.com", "bots": ["x"]}]}}})
    misspelt = parse({"bots": {"webBotAuth": {"agents": [{"origin": "https://a.test", "bot": ["x"]}]}}})
    assert misspelt.warnings == ["bots.web_bot_auth.agents[0].bot: unknown configuration key; ignored"]
