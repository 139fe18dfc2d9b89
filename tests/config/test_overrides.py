"""Live config overrides: which options are live, all-or-nothing validation, and the config each
process derives from the file plus the stored row."""

from __future__ import annotations

import pytest

from prerender_ray.config.model import Config
from prerender_ray.config.overrides import (
    LIVE_PATHS,
    LiveConfig,
    OverrideError,
    Overrides,
    camel_path,
    effective,
    plan,
    snake_path,
)

BASE = Config.model_validate({"ingress": {"routes": [{"match": "prefix", "path": "/shop/"}]}})
HOUR = 3_600_000


def test_a_config_survives_a_dump_and_revalidation_unchanged() -> None:
    assert Config.model_validate(BASE.model_dump()) == BASE


@pytest.mark.parametrize("path", ["render.defaultInterval", "render.default_interval", " render.defaultInterval "])
def test_either_spelling_of_a_path_is_accepted(path: str) -> None:
    assert snake_path(path) == "render.default_interval"
    assert camel_path("queue.ready.sitemap_boost") == "queue.ready.sitemapBoost"


def test_a_plan_lists_changes_and_noops_and_builds_the_config() -> None:
    p = plan(BASE, Overrides(), [{"path": "render.defaultInterval", "value": "6h"},
                                 {"path": "queue.ready.sitemapBoost", "value": 2}], None, by="ops", now=5)
    assert p.invalid == [] and p.config is not None
    assert p.changes == [{"path": "render.defaultInterval", "from": 86_400_000, "to": 6 * HOUR}]
    assert p.noop == [{"path": "queue.ready.sitemapBoost", "from": 2.0, "to": 2.0}]
    assert p.config.render.default_interval == 6 * HOUR
    assert p.overrides.meta["render.default_interval"] == {"updatedBy": "ops", "updatedTime": 5}


@pytest.mark.parametrize("entry, reason", [
    ({"path": "server.port", "value": 1}, "read at start only"),
    ({"path": "cacheKey.delimiter", "value": "#"}, "read at start only"),
    ({"path": "nope", "value": 1}, "unknown option"),
    ({"path": "render.defaultInterval", "value": 0}, "greater than 0"),
    ({"path": "queue.ready.sitemapBoost", "value": 0.5}, "greater than or equal to 1"),
    ({"path": "ingress.routes", "value": [{"match": "prefix", "path": "no-slash"}]}, "dropped"),
    ({"path": "ingress.routes", "value": [{"match": "prefix", "path": "/x/", "deviceTypes": ["toaster"]}]},
     "unknown device type"),
    ({"path": "ingress.routes", "value": [{"match": "prefix", "path": "/x/", "renderInterval": -4}]}, "dropped"),
    ({"path": "render.defaultInterval"}, "{path, value, note?}"),
    ({"path": "render.defaultInterval", "value": "1h", "note": 7}, "note must be"),
])
def test_a_bad_entry_makes_the_whole_plan_invalid(entry: dict, reason: str) -> None:
    good = {"path": "ingress.excludePathPatterns", "value": ["/cart/"]}
    p = plan(BASE, Overrides(), [good, entry], [], by="ops", now=1)
    assert p.config is None
    assert any(reason in i["reason"] for i in p.invalid), p.invalid


@pytest.mark.parametrize("sets, clears", [(None, None), ([], []), ("x", []), ([], "x"),
                                          ([{"path": "render.defaultInterval", "value": 1000}] * 201, [])])
def test_a_request_with_nothing_to_do_or_the_wrong_shape_is_refused(sets, clears) -> None:
    with pytest.raises(OverrideError):
        plan(BASE, Overrides(), sets, clears, by="ops", now=1)


def test_a_path_named_twice_or_set_and_cleared_is_invalid() -> None:
    twice = plan(BASE, Overrides(), [{"path": "render.defaultInterval", "value": "1h"},
                                     {"path": "render.default_interval", "value": "2h"}], [], by="a", now=1)
    assert "named twice" in twice.invalid[0]["reason"]
    both = plan(BASE, Overrides(), [{"path": "render.defaultInterval", "value": "1h"}],
                ["render.defaultInterval"], by="a", now=1)
    assert "set and cleared" in both.invalid[0]["reason"]


def test_clearing_returns_to_the_file_and_keeps_the_other_overrides() -> None:
    current = Overrides({"render.default_interval": HOUR, "queue.ready.sitemap_boost": 4},
                        {"render.default_interval": {"updatedBy": "a", "updatedTime": 1}})
    p = plan(BASE, current, [], ["render.defaultInterval"], by="ops", now=2)
    assert p.overrides.values == {"queue.ready.sitemap_boost": 4}
    assert p.changes == [{"path": "render.defaultInterval", "from": HOUR, "to": 86_400_000}]
    assert p.config.queue.ready.sitemap_boost == 4


def test_the_stored_row_round_trips_and_junk_is_an_error_not_a_config() -> None:
    ov = Overrides({"ingress.routes": [{"match": "exact", "path": "/"}]}, {"ingress.routes": {"note": "x"}})
    assert Overrides.decode(ov.encode()) == ov
    assert Overrides.decode(None) == Overrides() == Overrides.decode(b"")
    for junk in (b"{", b"[]", b'{"values": 3}'):
        with pytest.raises(OverrideError):
            Overrides.decode(junk)
    # a stored path that is not live (a hand edit, an older version) is ignored, never applied
    assert Overrides.decode(b'{"values": {"server.port": 1}}').values == {}


def test_only_live_paths_change_in_the_effective_config() -> None:
    ov = Overrides({"render.default_interval": HOUR, "ingress.exclude_path_patterns": ["/cart/"]})
    cfg = effective(BASE, ov)
    assert cfg.render.default_interval == HOUR and cfg.ingress.exclude_path_patterns == ["/cart/"]
    assert cfg.model_dump(exclude={"render": {"default_interval"}, "ingress": {"exclude_path_patterns"}}) == \
        BASE.model_dump(exclude={"render": {"default_interval"}, "ingress": {"exclude_path_patterns"}})
    assert set(LIVE_PATHS) >= set(ov.values)


def test_a_process_derives_its_config_only_when_the_row_changes() -> None:
    live = LiveConfig(BASE)
    raw = Overrides({"render.default_interval": HOUR}).encode()
    first = live.update(raw)
    assert first is not None and first.render.default_interval == HOUR and live.current is first
    assert live.update(raw) is None  # same row: nothing to do
    assert live.names() == ["render.defaultInterval"]
    assert live.update(b'{"values": {"render.default_interval": -1}}') is None  # junk keeps what runs
    assert live.error and live.current is first
    back = live.update(None)  # the row deleted: the file's config
    assert back == BASE and live.error is None


def test_a_route_change_that_re_keys_urls_says_so() -> None:
    forwarded = Config.model_validate({"ingress": {"mode": "forwarded",
                                                   "routes": [{"match": "prefix", "path": "/shop/"}]}})
    p = plan(forwarded, Overrides(), [{"path": "ingress.routes", "value": [
        {"match": "prefix", "path": "/shop/", "queryParams": ["color"], "deviceTypes": ["desktop"]}]}], [],
        by="ops", now=1)
    assert p.invalid == []
    text = " ".join(p.route_warnings)
    assert "cache keys" in text and "deviceTypes differ" in text
    quiet = plan(forwarded, Overrides(), [{"path": "render.defaultInterval", "value": "2h"}], [], by="ops", now=1)
    assert quiet.route_warnings == []


def test_a_row_that_does_not_apply_is_logged() -> None:
    logged: list[tuple] = []

    class Log:
        def error(self, event: str, **kw: object) -> None:
            logged.append((event, kw))

    live = LiveConfig(BASE)
    assert live.changed(b"junk", Log()) is None
    assert logged and logged[0][0] == "config overrides not applied" and "unreadable" in logged[0][1]["error"]
    assert live.changed(Overrides({"queue.ready.sitemap_boost": 3}).encode(), Log()).queue.ready.sitemap_boost == 3
    assert len(logged) == 1
