"""The origin policy's matcher: every `domains` entry form, default ports per scheme, IPv6, IDN and
case, URL-shaped entries refused with the fix, and the fetch refusal of an empty list."""

from __future__ import annotations

import pytest

from prerender_ray.config.loading import ConfigError, parse
from prerender_ray.config.model import Config
from prerender_ray.serving.origin_policy import Domains, NoCookies, OriginPolicy, parse_entry, public_address


def refusal(entries: list[str], url: str) -> str | None:
    return Domains(entries).url_refusal(url)


def allowed(entries: list[str], url: str) -> bool:
    return refusal(entries, url) is None


def test_a_bare_host_allows_the_default_port_of_each_scheme_only() -> None:
    assert allowed(["shop.test"], "http://shop.test/a") and allowed(["shop.test"], "https://shop.test/a")
    assert allowed(["shop.test"], "http://shop.test:80/") and allowed(["shop.test"], "https://shop.test:443/")
    assert not allowed(["shop.test"], "http://shop.test:443/")  # 443 is not http's default
    assert not allowed(["shop.test"], "https://shop.test:80/")
    assert refusal(["shop.test"], "http://shop.test:6379/") == (
        "shop.test:6379 is not allowed by domains; add 'shop.test:6379' or 'shop.test:*'")


def test_host_port_allows_that_port_for_both_schemes_and_host_star_any_port() -> None:
    assert allowed(["127.0.0.1:8080"], "http://127.0.0.1:8080/") and allowed(["127.0.0.1:8080"],
                                                                              "https://127.0.0.1:8080/")
    assert not allowed(["127.0.0.1:8080"], "http://127.0.0.1/")
    assert refusal(["127.0.0.1:8080"], "http://127.0.0.1:6379/") == (
        "127.0.0.1:6379 is not allowed by domains; add '127.0.0.1:6379' or '127.0.0.1:*'")
    assert all(allowed(["127.0.0.1:*"], f"http://127.0.0.1:{p}/") for p in (1, 80, 443, 6379, 65535))


def test_another_name_of_the_same_machine_is_another_host() -> None:
    assert refusal(["127.0.0.1:*"], "http://localhost:8080/") == (
        "localhost:8080 is not allowed by domains; add 'localhost:8080' or 'localhost:*'")
    assert not allowed(["127.0.0.1:*"], "http://127.0.0.2:8080/")
    assert not allowed(["127.0.0.1:*"], "http://[::1]:8080/")


def test_ipv6_literals_are_bracketed_and_match_with_their_ports() -> None:
    assert allowed(["[::1]"], "http://[::1]/") and not allowed(["[::1]"], "http://[::1]:8080/")
    assert allowed(["[::1]:8080"], "http://[::1]:8080/") and allowed(["[::1]:*"], "http://[::1]:9/")
    assert allowed(["[0:0::1]:8080"], "http://[::1]:8080/")  # the entry is read as a parser spells it
    assert refusal(["127.0.0.1:*"], "http://[::1]:8080/") == (
        "[::1]:8080 is not allowed by domains; add '[::1]:8080' or '[::1]:*'")


def test_names_match_whatever_their_case_and_idn_as_punycode() -> None:
    assert allowed(["Shop.TEST"], "HTTPS://SHOP.test/a")
    assert allowed(["bücher.de"], "https://xn--bcher-kva.de/")
    assert allowed(["BÜCHER.de"], "https://bücher.de/")
    assert allowed(["xn--bcher-kva.de:*"], "http://Bücher.de:81/")
    assert parse_entry("Bücher.DE:8080").text == "bücher.de:8080"


def test_an_empty_list_allows_every_host_and_a_non_http_url_is_refused() -> None:
    assert allowed([], "http://anything.test:6379/")
    assert "not an absolute http(s) URL" in refusal(["shop.test"], "ftp://shop.test/")


@pytest.mark.parametrize(("entry", "fix"), [
    ("http://127.0.0.1:29930", "domains entry 'http://127.0.0.1:29930' is a URL; write '127.0.0.1:29930'"),
    ("https://shop.test/", "domains entry 'https://shop.test/' is a URL; write 'shop.test'"),
    ("https://shop.test:443/x", "is a URL; write 'shop.test'"),
    ("shop.test/sitemap.xml", "is a URL; write 'shop.test'"),
    ("user@shop.test", "is a URL; write 'shop.test'"),
    ("shop.test?x=1", "is a URL"),
    ("::1", "write an IPv6 literal in brackets, e.g. '[::1]'"),
    ("[::1", "needs its closing ']'"),
    ("shop.test:0", "the port must be 1-65535 or '*'"),
    ("shop.test:99999", "the port must be 1-65535 or '*'"),
    ("shop.test:http", "the port must be 1-65535 or '*'"),
    (":8080", "has no host"),
])
def test_an_entry_that_is_not_host_or_host_port_is_refused_at_load_with_the_fix(entry, fix) -> None:
    with pytest.raises(ConfigError) as e:
        parse({"domains": ["shop.test", entry]}, {})
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith("domains: ")
    assert fix in e.value.problems[0]


def test_entries_are_kept_trimmed_and_lower_case() -> None:
    cfg = Config.model_validate({"domains": [" Shop.Test ", "", "[::1]:*"]})
    assert cfg.domains == ["shop.test", "[::1]:*"]


def test_an_empty_list_fetches_only_on_loopback_or_with_allow_any_domain() -> None:
    def policy(**cfg: object) -> OriginPolicy:
        return OriginPolicy(Config.model_validate(cfg))

    assert policy().url_refusal("http://anything.test:6379/") is None  # the default listener is loopback
    assert policy(server={"host": "0.0.0.0"}, allowAnyDomain=True).url_refusal("http://a.test/") is None
    closed = policy(server={"host": "0.0.0.0"}).url_refusal("http://a.test/")
    assert closed is not None and "origin fetches are off" in closed
    assert policy(server={"host": "0.0.0.0"}, domains=["a.test"]).url_refusal("http://a.test/") is None


def test_the_request_check_reads_the_host_as_the_http_client_parsed_it() -> None:
    p = OriginPolicy(Config.model_validate({"domains": ["127.0.0.1:8080", "[::1]:*", "bücher.de"]}))
    assert p.request_refusal("http", b"127.0.0.1", 8080) is None
    assert p.request_refusal("http", b"::1", 5) is None  # httpx gives an IPv6 host unbracketed
    assert p.request_refusal("https", b"xn--bcher-kva.de", None) is None  # None: the default port
    assert "127.0.0.1:6379 is not allowed" in p.request_refusal("http", b"127.0.0.1", 6379)
    assert "not http or https" in p.request_refusal("ftp", b"127.0.0.1", 8080)


def test_the_cookie_jar_keeps_nothing() -> None:
    from http.cookiejar import Cookie

    jar = NoCookies()
    jar.set_cookie(Cookie(0, "session", "1", None, False, "a.test", True, False, "/", True, False, None,
                          False, None, None, {}))
    assert len(jar) == 0


@pytest.mark.parametrize("ip, public", [
    ("93.184.216.34", True), ("2606:2800:220:1:248:1893:25c8:1946", True), ("::ffff:93.184.216.34", True),
    ("64:ff9b::5db8:d822", True),  # NAT64 of a public address
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("255.255.255.255", False),
    ("224.0.0.251", False), ("198.18.0.1", False), ("::1", False), ("::", False), ("fe80::1%eth0", False),
    ("fd00::1", False), ("ff02::1", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False),  # IPv4 carried in IPv6
    ("2002:7f00:1::", False), ("2002:a00:1::", False), ("64:ff9b::a9fe:a9fe", False),
    ("localhost", False), ("", False), ("not an address", False),
])
def test_a_public_address_is_one_of_the_public_internet_whatever_its_spelling(ip, public) -> None:
    assert public_address(ip) is public


def test_public_only_is_any_domain_on_a_listener_that_is_not_loopback() -> None:
    def policy(**cfg: object) -> OriginPolicy:
        return OriginPolicy(Config.model_validate(cfg))

    assert policy(allowAnyDomain=True, server={"host": "0.0.0.0"}).public_only
    assert not policy(allowAnyDomain=True).public_only  # loopback: only this machine asks
    assert not policy(allowAnyDomain=True, domains=["shop.test"], server={"host": "0.0.0.0"}).public_only
    assert not policy(domains=["shop.test"], server={"host": "0.0.0.0"}).public_only
