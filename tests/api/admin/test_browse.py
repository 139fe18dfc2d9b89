"""The pages listing over a prefix of many deleted pages: each call reads a bounded number of
records and the listing goes on from where it stopped (``actors/store/actor.py`` ``LISTING_SCAN``)."""

from __future__ import annotations

import httpx
import pytest

from prerender_ray.actors.store import actor
from tests.localnode import LocalNode
from tests.support import write_page


@pytest.fixture
def node(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(actor, "LISTING_SCAN", 4)
    n = LocalNode.start(tmp_path / "data", {"domains": ["shop.test"]})
    yield n
    n.stop()


def test_a_prefix_of_deleted_pages_is_listed_a_bounded_scan_at_a_time(node: LocalNode) -> None:
    gone = [f"https://shop.test/gone/{i:02d}|desktop" for i in range(10)]
    for key in gone:
        write_page(node, key, b"<html>retired</html>")
    node.ask("store", "apply", [], [(key.encode(), None) for key in gone])  # tombstones, kept for replication
    live = "https://shop.test/gone/zz|desktop"
    write_page(node, live, b"<html>live</html>")

    calls, seen, cursor = 0, [], None
    while True:
        calls += 1
        params = {"prefix": "https://shop.test/gone/"} | ({"cursor": cursor} if cursor else {})
        r = httpx.get(f"{node.url}/prerender_admin/pages", params=params, timeout=30)
        assert r.status_code == 200, r.text
        doc = r.json()
        seen += [p["cacheKey"] for p in doc["pages"]]
        assert doc["truncated"] == (doc["nextCursor"] is not None)
        cursor = doc["nextCursor"]
        if not cursor:
            break
    assert seen == [live] and doc["total"] == 1
    assert calls == 3  # 11 records, 4 a call: the store never read them all in one
