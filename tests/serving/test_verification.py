"""Crawler verification with an injected resolver and clock, and local range files: no test here
touches DNS or the network."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prerender_ray.config.bots import Verify
from prerender_ray.serving.bot_policy import FAILED, UNCHECKED, UNVERIFIED, VERIFIED
from prerender_ray.serving.verification import (
    RangeError,
    RangeSet,
    RangeStore,
    Verifier,
    parse_ranges,
)

REAL = "66.249.66.1"
SPOOF = "203.0.113.9"


class FakeResolver:
    """PTR and forward records from dicts; a name in ``hang`` waits for ``release``; ``fail`` raises."""

    def __init__(self, ptr: dict | None = None, a: dict | None = None, *, hang: set | None = None,
                 fail: set | None = None):
        self.ptr = ptr or {}
        self.a = a or {}
        self.hang = hang or set()
        self.fail = fail or set()
        self.release = asyncio.Event()
        self.calls: list[tuple[str, str]] = []

    async def _lookup(self, kind: str, key: str, table: dict) -> list:
        self.calls.append((kind, key))
        if key in self.hang:
            await self.release.wait()
        if key in self.fail:
            raise OSError("SERVFAIL")
        return table.get(key, [])

    async def reverse(self, address: str) -> list:
        return await self._lookup("ptr", address, self.ptr)

    async def forward(self, host: str) -> list:
        return await self._lookup("a", host, self.a)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def verify_cfg(**verify):
    """A generous deadline unless a test sets one: a loaded machine must not turn an instant fake
    answer into unverified-for-now."""
    return Verify.model_validate({"enabled": True, "deadlineMs": 5000, **verify})


def verifier(resolver: FakeResolver, clock: Clock | None = None, **verify) -> Verifier:
    return Verifier(verify_cfg(**verify), resolver=resolver, clock=clock or Clock())


GOOGLE = FakeResolver(ptr={REAL: ["crawl-66-249-66-1.googlebot.com."]},
                      a={"crawl-66-249-66-1.googlebot.com": [REAL]})


# ---------------------------------------------------------------------------------- reverse DNS


@pytest.mark.parametrize(("ptr", "a", "state"), [
    (["crawl-66-249-66-1.googlebot.com."], [REAL], VERIFIED),  # the documented method
    (["rate-limited-proxy-66-249-66-1.google.com"], [REAL], VERIFIED),
    (["google-proxy-66-249-66-1.gae.googleusercontent.com"], [REAL], VERIFIED),  # a user-triggered fetcher
    # any Compute Engine VM's default PTR, resolving back: before, it passed as a verified Googlebot
    (["1-2-3-4.bc.googleusercontent.com"], [REAL], FAILED),
    (["66.66.249.66.bc.googleusercontent.com"], [REAL], FAILED),
    (["googleusercontent.com"], [REAL], FAILED),
    (["CRAWL-66-249-66-1.GOOGLEBOT.COM"], [REAL], VERIFIED),  # DNS names are case-insensitive
    ([], [], FAILED),  # no PTR
    (["host.evil.example"], [REAL], FAILED),  # not Google's
    (["crawl.googlebot.com.evil.example"], [REAL], FAILED),  # the domain inside another name
    (["evilgooglebot.com"], [REAL], FAILED),  # a suffix is a label boundary
    (["crawl.googlebot.com"], ["198.51.100.7"], FAILED),  # the PTR lies: forward gives another address
    (["crawl.googlebot.com"], [], FAILED),  # ... or nothing
    (["a" * 250 + ".googlebot.com"], [REAL], FAILED),  # longer than a host name can be
    ([None, 3, b"crawl.googlebot.com"], [REAL], FAILED),  # a resolver answering garbage
    (["crawl.googlebot.com"], [None, "not-an-ip", 7], FAILED),
])
async def test_reverse_dns_confirmed_forward(ptr: list, a: list, state: str) -> None:
    names = [p for p in ptr if isinstance(p, str)]
    resolver = FakeResolver(ptr={REAL: ptr}, a={n.lower().rstrip("."): a for n in names})
    assert await verifier(resolver).check("Googlebot", REAL) == state


async def test_each_operator_has_its_own_domains() -> None:
    resolver = FakeResolver(ptr={REAL: ["msnbot-1.search.msn.com"]}, a={"msnbot-1.search.msn.com": [REAL]})
    v = verifier(resolver)
    assert await v.check("Bingbot", REAL) == VERIFIED
    assert await v.check("Googlebot", REAL) == FAILED  # a real Bing address claiming Googlebot
    assert await v.check("Applebot", REAL) == FAILED


async def test_a_bot_without_a_method_is_unchecked_and_costs_no_lookup() -> None:
    resolver = FakeResolver()
    v = verifier(resolver)
    assert not v.applies("Twitterbot") and await v.check("Twitterbot", REAL) == UNCHECKED
    assert await v.check("other", REAL) == UNCHECKED
    assert resolver.calls == []


async def test_configured_domains_add_to_and_replace_the_built_in_ones() -> None:
    resolver = FakeResolver(ptr={REAL: ["c1.crawl.example"]}, a={"c1.crawl.example": [REAL]})
    v = verifier(resolver, dns={"ExampleBot": ["crawl.example"], "Googlebot": ["crawl.example"]})
    assert await v.check("examplebot", REAL) == VERIFIED
    assert await v.check("Googlebot", REAL) == VERIFIED
    off = verifier(FakeResolver(), builtinDns=False)
    assert not off.applies("Googlebot")


async def test_no_client_address_is_unverified() -> None:
    v = verifier(GOOGLE)
    for client in (None, "", "unknown", "not an ip"):
        assert await v.check("Googlebot", client) == UNVERIFIED


async def test_ipv4_mapped_ipv6_is_the_ipv4_address() -> None:
    assert await verifier(GOOGLE).check("Googlebot", f"::ffff:{REAL}") == VERIFIED


@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[a-z0-9-]{1,20}(\.[a-z0-9-]{1,20}){0,3}\.?", fullmatch=True),
       st.sampled_from([REAL, "198.51.100.7"]))
def test_a_spoofer_controlling_its_reverse_zone_never_passes(ptr: str, forward: str) -> None:
    """Whatever PTR a spoofer's own zone returns, and whatever its forward record says, the claim
    verifies only when the name is in Google's domains and resolves back to the address."""
    host = ptr.rstrip(".")
    resolver = FakeResolver(ptr={SPOOF: [ptr]}, a={host: [forward, SPOOF]})
    state = asyncio.run(verifier(resolver).check("Googlebot", SPOOF))
    google = any(host == d or host.endswith("." + d) for d in ("googlebot.com", "google.com",
                                                              "gae.googleusercontent.com"))
    assert state == (VERIFIED if google else FAILED)


# ------------------------------------------------------------------------ deadline, cache, bounds


async def test_a_slow_resolver_never_holds_a_request_past_the_deadline() -> None:
    resolver = FakeResolver(ptr=GOOGLE.ptr, a=GOOGLE.a, hang={REAL})
    v = verifier(resolver, deadlineMs=20)
    assert await v.check("Googlebot", REAL) == UNVERIFIED  # served unverified-for-now
    assert await v.check("Googlebot", REAL) == UNVERIFIED  # the same check still running: not a second one
    assert resolver.calls == [("ptr", REAL)]
    resolver.release.set()  # the answer comes in the background...
    for _ in range(50):
        await asyncio.sleep(0.01)
        if not v._pending:
            break
    assert await v.check("Googlebot", REAL) == VERIFIED  # ...and the cache has it
    assert resolver.calls == [("ptr", REAL), ("a", "crawl-66-249-66-1.googlebot.com")]


async def test_a_lookup_that_never_ends_is_unverified_and_retried_later() -> None:
    clock = Clock()
    resolver = FakeResolver(hang={REAL})
    v = verifier(resolver, clock, deadlineMs=5, lookupTimeoutMs=30, retryAfter="60s")
    assert await v.check("Googlebot", REAL) == UNVERIFIED
    await asyncio.sleep(0.1)  # past the lookup deadline: the background check gave up
    assert not v._pending and v.stats["errors"] == 1
    assert await v.check("Googlebot", REAL) == UNVERIFIED and len(resolver.calls) == 1  # remembered
    clock.t += 61
    await v.check("Googlebot", REAL)
    assert len(resolver.calls) == 2  # asked again after retryAfter


async def test_a_resolver_error_is_unverified_not_failed() -> None:
    v = verifier(FakeResolver(fail={REAL}))
    assert await v.check("Googlebot", REAL) == UNVERIFIED


async def test_answers_expire_after_their_ttl() -> None:
    clock = Clock()
    resolver = FakeResolver(ptr=GOOGLE.ptr, a=GOOGLE.a)
    v = verifier(resolver, clock, ttl="1h")
    assert await v.check("Googlebot", REAL) == VERIFIED
    assert await v.check("Googlebot", REAL) == VERIFIED and len(resolver.calls) == 2
    clock.t += 3601
    assert await v.check("Googlebot", REAL) == VERIFIED and len(resolver.calls) == 4


async def test_the_cache_is_bounded_least_recent_first() -> None:
    resolver = FakeResolver()
    v = verifier(resolver, cacheSize=2)
    for ip in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        assert await v.check("Googlebot", ip) == FAILED
    assert len(v._cache) == 2
    await v.check("Googlebot", "192.0.2.1")  # evicted: asked again
    assert [c for c in resolver.calls if c == ("ptr", "192.0.2.1")] == [("ptr", "192.0.2.1")] * 2


async def test_pending_checks_are_bounded() -> None:
    resolver = FakeResolver(hang={"192.0.2.1", "192.0.2.2"})
    v = verifier(resolver, deadlineMs=5, maxPending=1)
    assert await v.check("Googlebot", "192.0.2.1") == UNVERIFIED
    assert await v.check("Googlebot", "192.0.2.2") == UNVERIFIED
    assert resolver.calls == [("ptr", "192.0.2.1")] and v.stats["overloaded"] == 1
    v.close()


# ------------------------------------------------------------------------------------- ip ranges

GOOGLE_JSON = json.dumps({"creationTime": "2026-01-01", "prefixes": [
    {"ipv4Prefix": "192.0.2.0/28"}, {"ipv6Prefix": "2001:db8::/64"}, {"ipv4Prefix": "198.51.100.0/24"}]})


def test_the_published_json_and_plain_cidr_lines_parse() -> None:
    nets = parse_ranges(GOOGLE_JSON.encode(), max_prefixes=10)
    assert [str(n) for n in nets] == ["192.0.2.0/28", "2001:db8::/64", "198.51.100.0/24"]
    text = b"# openai\n192.0.2.0/28\n\n2001:db8::/64  # v6\n198.51.100.7\n"
    assert [str(n) for n in parse_ranges(text, max_prefixes=10)] == ["192.0.2.0/28", "2001:db8::/64",
                                                                      "198.51.100.7/32"]


@pytest.mark.parametrize(("data", "says"), [
    (b"{not json", "not valid JSON"),
    (b'{"prefixes": {}}', "'prefixes' array"),
    (b'{"prefixes": [{"ipv4Prefix": 3}]}', "prefixes[0] has no"),
    (b'{"prefixes": [{"ipv4Prefix": "300.1.1.0/24"}]}', "prefixes[0]: not an IP network"),
    (b"192.0.2.0/24\nexample.com\n", "line 2: not an IP network"),
    (b"\xff\xfe", "not UTF-8"),
    (b"\n".join(b"192.0.2.%d" % i for i in range(11)), "more than maxPrefixes"),
])
def test_a_malformed_range_file_is_a_clear_error(data: bytes, says: str) -> None:
    with pytest.raises(RangeError, match=re.escape(says)):
        parse_ranges(data, max_prefixes=10, source="gptbot.json")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(8, 32)), max_size=30),
       st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20))
def test_a_range_set_answers_as_a_linear_scan_does(nets: list, probes: list) -> None:
    networks = [ipaddress.ip_network((addr, plen), strict=False) for addr, plen in nets]
    found = RangeSet(networks)
    for p in probes:
        address = ipaddress.ip_address(p)
        assert (address in found) == any(address in n for n in networks)


async def test_ranges_verify_from_files_and_a_bad_file_keeps_the_last_good_one(tmp_path) -> None:
    good = tmp_path / "gptbot.json"
    good.write_text(GOOGLE_JSON)
    cfg = verify_cfg(ranges={"GPTBot": [str(good)], "PerplexityBot": [str(tmp_path / "missing.txt")]})
    v = Verifier(cfg, resolver=FakeResolver())
    assert v.ranges.reload() == [f"{tmp_path / 'missing.txt'}: cannot read (No such file or directory)"]
    assert await v.check("GPTBot", "192.0.2.5") == VERIFIED
    assert await v.check("gptbot", "2001:db8::1") == VERIFIED
    assert await v.check("GPTBot", SPOOF) == FAILED
    assert await v.check("PerplexityBot", SPOOF) == UNVERIFIED  # its file never loaded: we cannot tell
    good.write_text("garbage")
    assert "not an IP network" in v.ranges.reload()[0] or "not an IP network" in v.ranges.reload()[1]
    assert await v.check("GPTBot", "192.0.2.5") == VERIFIED  # the previous ranges stay


def test_a_range_file_past_its_size_cap_is_refused(tmp_path) -> None:
    big = tmp_path / "big.txt"
    big.write_bytes(b"192.0.2.0/24\n" * 200)
    store = RangeStore({"GPTBot": [str(big)]}, max_bytes=1024, max_prefixes=1000)
    assert store.reload() == [f"{big}: larger than maxRangeBytes (1024)"]
    assert store.sets == {}
