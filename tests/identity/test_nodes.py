from __future__ import annotations

import collections

from prerender_ray.identity.nodes import LABEL_NAME, LABEL_PORT, NodeInfo, Ownership, describe_ray_node

NAMES = ["node-a", "node-b", "node-c"]


def test_ownership_vectors_are_pinned() -> None:
    # Change detectors: a different hash or seed would move every key to another node.
    own = Ownership(NAMES)
    got = {u: own.owner(u) for u in [
        "https://example.com/catalog?page=0", "https://example.com/catalog?page=2",
        "https://example.com/catalog?page=8", "https://example.com/catalog?page=3",
        "https://www.example.com/", "https://www.example.com/p/1",
    ]}
    assert got == PINNED


# owner = argmax over names of xxh64(url, seed=xxh64(name)); computed once with xxhash 4.1.
PINNED = {
    "https://example.com/catalog?page=0": "node-c",
    "https://example.com/catalog?page=2": "node-b",
    "https://example.com/catalog?page=8": "node-a",
    "https://example.com/catalog?page=3": "node-a",
    "https://www.example.com/": "node-a",
    "https://www.example.com/p/1": "node-c",
}


def test_every_node_agrees_whatever_order_it_learned_the_names_in() -> None:
    a, b = Ownership(NAMES), Ownership(list(reversed(NAMES)) + ["node-a"])
    for i in range(500):
        url = f"https://shop.example/p/{i}"
        assert a.owner(url) == b.owner(url)


def test_load_is_balanced_and_only_the_removed_nodes_keys_move() -> None:
    urls = [f"https://shop.example/p/{i}" for i in range(6000)]
    three = Ownership(NAMES)
    before = {u: three.owner(u) for u in urls}
    counts = collections.Counter(before.values())
    assert max(counts.values()) / (len(urls) / 3) < 1.1
    two = Ownership(["node-a", "node-c"])
    moved = [u for u in urls if two.owner(u) != before[u]]
    assert all(before[u] == "node-b" for u in moved)


def test_an_empty_or_nameless_membership_never_replaces_a_good_one() -> None:
    own = Ownership(NAMES)
    assert own.update([]) is False
    assert own.update(["", None]) is False  # type: ignore[list-item]
    assert own.names == tuple(NAMES)
    assert own.update(["node-a", "node-b"]) is True


def test_labels_override_the_configured_name_and_port() -> None:
    raw = {"NodeID": "abc", "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "host3",
           "Labels": {LABEL_NAME: "web-3", LABEL_PORT: "9930"}}
    info = describe_ray_node(raw, default_name="", default_port=9926, advertise_host="", tls=False)
    assert (info.name, info.port, info.host) == ("web-3", 9930, "10.0.0.3")
    plain = describe_ray_node({"NodeManagerHostname": "host3", "NodeManagerAddress": "10.0.0.3"},
                              default_name="", default_port=9926, advertise_host="", tls=False)
    assert (plain.name, plain.port) == ("host3", 9926)


def test_the_callback_origin_brackets_ipv6_and_follows_tls() -> None:
    assert NodeInfo("a", "127.0.0.1", 9926).url == "http://127.0.0.1:9926"
    assert NodeInfo("a", "2001:db8::1", 9926, tls=True).url == "https://[2001:db8::1]:9926"


def test_holders_are_the_first_r_of_the_rendezvous_order_with_the_owner_first() -> None:
    names = [f"node-{c}" for c in "abcde"]
    own = Ownership(names)
    urls = [f"https://shop.test/p/{i}" for i in range(2000)]
    for url in urls:
        three = own.holders(url, 3)
        assert len(three) == len(set(three)) == 3 and three[0] == own.owner(url)
        assert own.holders(url, 2) == three[:2] and own.holders(url, 1) == three[:1]
        assert sorted(own.holders(url, 9)) == names and own.holders(url, 9)[0] == own.owner(url)
    # each node holds about R/N of the URLs
    counts = {n: sum(n in own.holders(u, 3) for u in urls) for n in names}
    assert all(abs(c - 1200) < 150 for c in counts.values()), counts


def test_a_node_leaving_moves_only_the_urls_it_held() -> None:
    names = [f"node-{c}" for c in "abcde"]
    five, four = Ownership(names), Ownership([n for n in names if n != "node-c"])
    for url in (f"https://shop.test/p/{i}" for i in range(2000)):
        before, after = five.holders(url, 3), four.holders(url, 3)
        if "node-c" not in before:
            assert after == before
        else:  # the survivors keep their order; the next node in line joins at the end
            assert after[:2] == tuple(n for n in before if n != "node-c") and after[2] not in before
