"""The client address behind trusted proxies only: X-Forwarded-For is believed from them alone."""

from __future__ import annotations

import pytest

from prerender_ray.serving.proxies import Proxies, parse_address, parse_networks


def test_without_trusted_proxies_the_peer_is_the_client_whatever_the_header_says() -> None:
    p = Proxies()
    assert p.client("127.0.0.1", "203.0.113.9") == "127.0.0.1"
    assert p.client("127.0.0.1", None) == "127.0.0.1"
    assert p.client(None, "1.2.3.4") == "unknown"
    assert not p.trusts("127.0.0.1")
    assert p.hides_client("127.0.0.1", "203.0.113.9") and not p.hides_client("127.0.0.1", " ")


def test_behind_a_trusted_proxy_the_right_most_untrusted_hop_is_the_client() -> None:
    p = Proxies(["127.0.0.1", "10.0.0.0/8"])
    assert p.client("127.0.0.1", "203.0.113.9") == "203.0.113.9"
    # the client wrote the left part itself: only the hop our proxies appended counts
    assert p.client("127.0.0.1", "1.1.1.1, 2.2.2.2, 203.0.113.9, 10.1.2.3") == "203.0.113.9"
    assert p.client("127.0.0.1", "10.0.0.9, 10.0.0.8") == "10.0.0.9"  # every hop ours: the left-most
    assert p.client("127.0.0.1", None) == "127.0.0.1"
    assert p.client("192.0.2.1", "203.0.113.9") == "192.0.2.1"  # an untrusted peer's header proves nothing
    assert not p.hides_client("127.0.0.1", "203.0.113.9") and p.hides_client("192.0.2.1", "203.0.113.9")


def test_ports_brackets_ipv6_and_garbage_hops() -> None:
    p = Proxies(["::1", "127.0.0.1"])
    assert p.client("::1", "[2001:db8::7]:443") == "2001:db8::7"
    assert p.client("127.0.0.1", "198.51.100.4:5555") == "198.51.100.4"
    assert p.client("127.0.0.1", "2001:db8::8") == "2001:db8::8"
    # a hop that is no address stops at the proxy that wrote it (never the garbage itself)
    assert p.client("127.0.0.1", "198.51.100.4, unknown") == "127.0.0.1"
    assert p.client("127.0.0.1", "198.51.100.4, ::1, _hidden") == "127.0.0.1"
    assert parse_address("not an ip") is None and str(parse_address(" [::1] ")) == "::1"


@pytest.mark.parametrize("bad", ["proxy.local", "10.0.0.1/8", "300.1.1.1", ""])
def test_a_bad_entry_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValueError, match="is not an IP address or CIDR network"):
        parse_networks([bad])


def test_the_config_option_validates_its_entries() -> None:
    from prerender_ray.config.loading import parse

    assert parse({"server": {"trustedProxies": ["10.0.0.0/8", "::1"]}}).config.server.trusted_proxies == [
        "10.0.0.0/8", "::1"]
    with pytest.raises(Exception, match="trusted_proxies"):
        parse({"server": {"trustedProxies": ["proxy.local"]}})
