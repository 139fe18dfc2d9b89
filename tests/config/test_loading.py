from __future__ import annotations

from pathlib import Path

import pytest

from prerender_ray.config import loading
from prerender_ray.config.base import is_loopback
from prerender_ray.config.loading import ConfigError, parse
from prerender_ray.config.model import SECRET_PATHS, Config


def problems(raw: object, env: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse(raw, env or {})
    return e.value.problems


def test_the_embedded_defaults_match_the_reference() -> None:
    cfg = parse({}, {}).config
    assert cfg.server.port == 9926
    assert cfg.ingress.bot_path_prefix == "/p/"
    assert cfg.cache_key.query_params == ["page"]
    assert cfg.cache_key.decode_reserved == [":", ",", "@"]
    assert cfg.device_types.default == ["desktop", "mobile"]
    assert cfg.page.swr_ttl == 3 * 3600_000
    assert cfg.queue.job_lease_time == 600_000
    assert cfg.queue.max_claim_limit == 25
    assert cfg.render.failure_retry.fast_retries == 2
    assert cfg.sitemap.user_agent == "HarperSitemapCrawler/1.0"


def test_camel_case_and_snake_case_spellings_are_the_same_option() -> None:
    a = parse({"queue": {"jobLeaseTime": 300000}, "cacheKey": {"queryParams": ["*"]}}, {}).config
    b = parse({"queue": {"job_lease_time": 300000}, "cache_key": {"query_params": ["*"]}}, {}).config
    assert a == b
    assert a.queue.job_lease_time == 300000


def test_durations_accept_unit_suffixes() -> None:
    cfg = parse({"render": {"defaultInterval": "6h"}, "queue": {"jobLeaseTime": "2m"}}, {}).config
    assert cfg.render.default_interval == 6 * 3600_000
    assert cfg.queue.job_lease_time == 120_000


def test_unknown_keys_are_reported_by_full_path_and_dropped() -> None:
    loaded = parse({"nonsenseKey": 1, "queue": {"ready": {"capacityy": 3}}}, {})
    assert "nonsense_key: unknown configuration key; ignored" in loaded.warnings
    assert "queue.ready.capacityy: unknown configuration key; ignored" in loaded.warnings


def test_reference_options_this_design_drops_warn_instead_of_failing() -> None:
    loaded = parse({"queue": {"claimFloor": {"enabled": True}}, "invalidation": {"enabled": False}}, {})
    assert "queue.claim_floor: not supported by prerender-ray; ignored" in loaded.warnings
    assert "invalidation: not supported by prerender-ray; ignored" in loaded.warnings


def test_moved_reference_keys_apply_at_their_new_path_and_the_new_path_wins() -> None:
    loaded = parse({"botPathPrefix": "/render/", "url": {"queryParams": ["q"]}}, {})
    assert loaded.config.ingress.bot_path_prefix == "/render/"
    assert loaded.config.cache_key.query_params == ["q"]
    assert any("moved to ingress.bot_path_prefix" in w for w in loaded.warnings)
    assert not any(w.startswith("url:") for w in loaded.warnings)  # the emptied group is not "unknown"
    both = parse({"botPathPrefix": "/old/", "ingress": {"botPathPrefix": "/new/"}}, {})
    assert both.config.ingress.bot_path_prefix == "/new/"
    assert any("ingress.bot_path_prefix wins" in w for w in both.warnings)


def test_a_null_value_means_absent_and_keeps_the_default() -> None:
    assert parse({"server": {"port": None}}, {}).config.server.port == 9926


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"server": {"port": 99999}}, "server.port: Input should be less than or equal to 65535 (got 99999)"),
        ({"queue": {"jobLeaseTime": -5}}, "queue.job_lease_time: Input should be greater than or equal to 120000"),
        ({"render": {"defaultInterval": -1}}, "render.default_interval: Input should be greater than 0"),
        # an infinite float, which int() refused with an OverflowError that escaped the validation
        ({"render": {"defaultInterval": "9" * 400 + "d"}}, "render.default_interval: not a duration: too many digits"),
        # finite, but past 64-bit milliseconds once added to now
        ({"render": {"defaultInterval": "9" * 300 + "d"}}, "render.default_interval: Input should be less than or equal to 3153600000000"),
        ({"render": {"defaultInterval": 10**20}}, "render.default_interval: Input should be less than or equal to 3153600000000"),
        ({"ingress": {"mode": "sideways"}}, "ingress.mode: Input should be 'prefix' or 'forwarded'"),
        ({"cacheKey": {"decodeReserved": [":", "&"]}}, "cache_key.decode_reserved:"),
        ({"deviceTypes": {"supported": []}}, "device_types.supported:"),
        ({"deviceTypes": {"default": ["watch"]}}, "default device types ['watch'] are not in supported"),
        ({"sitemap": {"timezone": "Mars/Olympus"}}, "sitemap.timezone: unknown time zone 'Mars/Olympus'"),
        ({"origin": {"staging": {"ip": "not-an-ip"}}}, "origin.staging.ip:"),
        ({"server": {"port": "eighty"}}, "server.port: Input should be a valid integer"),
    ],
)
def test_an_invalid_value_is_an_error_naming_its_path_and_value(raw: dict, expected: str) -> None:
    found = problems(raw)
    assert any(expected in p for p in found), found


def test_an_unknown_device_type_in_a_route_is_an_error() -> None:
    found = problems({"ingress": {"routes": [{"match": "prefix", "path": "/a/", "deviceTypes": ["watch"]}]}})
    assert found == ["ingress.routes[0] (prefix /a/): unknown device type(s) ['watch']; "
                     "supported: ['desktop', 'mobile', 'tablet']"]


def test_a_malformed_route_is_dropped_alone_with_a_warning() -> None:
    loaded = parse({"ingress": {"routes": [{"match": "typo", "path": "/a"}, {"match": "prefix", "path": "/b/"}]}}, {})
    assert any("ingress.routes[0] (typo /a): dropped" in w for w in loaded.warnings)


def test_an_empty_domain_allowlist_on_a_public_listener_is_refused_unless_allowed_explicitly() -> None:
    assert any(p.startswith("domains:") for p in problems({"server": {"host": "0.0.0.0"}}))
    ok = parse({"server": {"host": "0.0.0.0"}, "allowAnyDomain": True}, {})
    found = next(f.message for f in ok.findings if f.key == "domains")
    assert "open proxy" in found and "only public addresses" in found and "the security token goes" in found
    assert "POST and other methods are relayed" in found
    closed = parse({"server": {"host": "0.0.0.0"}, "allowAnyDomain": True, "origin": {"proxyOtherMethods": False}}, {})
    assert "relayed" not in next(f.message for f in closed.findings if f.key == "domains")
    loopback = parse({"allowAnyDomain": True}, {})
    assert "public addresses" not in next(f.message for f in loopback.findings if f.key == "domains")
    parse({"server": {"host": "0.0.0.0"}, "domains": ["www.example.com"]}, {})


def test_a_listener_is_loopback_by_one_test_and_a_bracketed_one_is_refused() -> None:
    for host in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", None, "10.0.0.1", "localhost.evil.example", "[::2]"):
        assert not is_loopback(host), host
    # a listener on IPv6 loopback needs no domains; its bracketed spelling cannot be bound: refused
    parse({"server": {"host": "::1"}}, {})
    found = problems({"server": {"host": "[::1]"}})
    assert len(found) == 1 and "without brackets" in found[0] and found[0].startswith("server.host")


def test_secrets_come_from_their_environment_variable_and_are_redacted() -> None:
    env = {"BYPASS": "s3cret"}
    cfg = parse({"origin": {"securityToken": {"valueEnv": "BYPASS"}}}, env).config
    assert cfg.origin.security_token.value == "s3cret"
    shown = loading.redact(cfg)
    assert shown["origin"]["security_token"]["value"] == "<set: 6 chars>"
    assert shown["render_now"]["token"] == "<empty>"
    assert "s3cret" not in str(shown)


def test_redact_shows_password_hashes_only_as_set() -> None:
    digest = "pbkdf2_sha256$1000$c2FsdA$ZGlnZXN0ZGlnZXN0"
    cfg = parse({"auth": {"users": [{"name": "ops", "roles": ["admin"], "passwordHash": digest},
                                    {"name": "fleet", "roles": ["fleet"], "passwordEnv": "FLEET_PW"}]}}, {}).config
    users = loading.redact(cfg)["auth"]["users"]
    assert [u["password_hash"] for u in users] == ["<set>", "<empty>"]
    assert users[1]["password_env"] == "FLEET_PW" and users[0]["roles"] == ["admin"]
    assert "ZGlnZXN0" not in str(loading.redact(cfg))


def _nest(path: str, value: object) -> dict:
    raw: dict = {}
    node = raw
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return raw


@pytest.mark.parametrize("path", sorted(SECRET_PATHS))
@pytest.mark.parametrize("value", [987654321, ["987654321"], [{"x": "987654321"}], 9876543.21])
def test_a_wrongly_typed_secret_is_an_error_that_does_not_echo_it(path: str, value: object) -> None:
    # `up` and `config check` print these lines to stderr, which ends up in CI logs.
    found = problems(_nest(path, value))
    assert any(p.startswith(path) for p in found), found
    assert not any("987654321" in p or "9876543" in p for p in found), found


def test_a_wrongly_typed_password_hash_is_an_error_that_does_not_echo_it() -> None:
    found = problems({"auth": {"users": [{"name": "a", "roles": ["admin"], "passwordHash": 987654321}]}})
    assert any(p.startswith("auth.users.0.password_hash") for p in found), found
    assert not any("987654321" in p for p in found), found


@pytest.mark.parametrize("url", ["mqtts://user:pw-s3cret@broker.example", "mqtt://user@broker.example:1883",
                                 "wss://:pw-s3cret@broker.example/mqtt"])
def test_credentials_in_the_mqtt_url_are_refused_naming_the_options_to_use(url: str) -> None:
    # The broadcaster never logged in with them, and the admin config view showed them as written.
    found = problems({"fleet": {"mqtt": {"url": url}}})
    assert any(p.startswith("fleet.mqtt.url:") and "fleet.mqtt.username" in p and "passwordEnv" in p
               for p in found), found
    assert not any("s3cret" in p for p in found), found


@pytest.mark.parametrize("raw, path", [
    ({"fleet": {"mqtt": {"url": "mqtts://user:pw-s3cret@broker.example"}}}, "fleet.mqtt.url"),
    ({"bots": {"verify": {"ranges": {"googlebot": ["https://u:pw-s3cret@x.example/r.json"]}}}}, "bots.verify.ranges"),
    ({"domains": ["https://u:pw-s3cret@x.example"]}, "domains"),
])
def test_a_refused_url_option_does_not_show_its_credentials_back(raw: dict, path: str) -> None:
    found = problems(raw)
    assert any(p.startswith(f"{path}:") and "<credentials>@" in p for p in found), found
    assert not any("s3cret" in p for p in found), found


def test_risky_config_findings_name_their_keys() -> None:
    findings = parse({"ingress": {"mode": "forwarded", "routes": [{"match": "prefix", "path": "/x/",
                                                                  "mode": "passthrough"}]},
                      "renderNow": {"enabled": True, "valueEnv": "RN_TOKEN"}}, {}).findings
    keys = {f.key for f in findings}
    assert {"origin.security_token.value", "domains", "ingress.routes", "render_now.token", "auth.users"} <= keys
    rn = next(f for f in findings if f.key == "render_now.token")
    assert "RN_TOKEN" in rn.message and "DISABLED" in rn.message


def test_a_short_shared_secret_is_a_finding_and_a_long_one_is_not() -> None:
    def short(raw: dict) -> set[str]:
        return {f.key for f in parse(raw, {}).findings if "shorter than 16 characters" in f.message}

    weak = "s3cret"
    assert short({"origin": {"securityToken": {"value": weak}}, "renderNow": {"enabled": True, "token": weak},
                  "peerRescue": {"enabled": True, "token": weak}}) == \
        {"origin.security_token.value", "render_now.token", "peer_rescue.token"}
    strong = "k" * 16
    assert short({"origin": {"securityToken": {"value": strong}}, "renderNow": {"enabled": True, "token": strong},
                  "peerRescue": {"enabled": True, "token": strong}}) == set()
    assert short({"peerRescue": {"enabled": False, "token": weak}}) == set()  # not in use
    assert not any(weak in f.message for f in parse({"peerRescue": {"enabled": True, "token": weak}}, {}).findings)


def test_one_valid_prerender_route_clears_the_forwarded_mode_finding() -> None:
    findings = parse({"ingress": {"mode": "forwarded", "routes": [{"match": "prefix", "path": "/x/"}]}}, {}).findings
    assert "ingress.routes" not in {f.key for f in findings}


def test_a_file_that_is_not_yaml_is_one_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        loading.load(f, {})
    assert len(e.value.problems) == 1
    assert "not valid YAML at line" in e.value.problems[0]


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        loading.load(tmp_path / "nope.yaml", {})
    assert "cannot read config file" in e.value.problems[0]


def test_a_reference_style_prerender_block_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("prerender:\n  queue:\n    maxClaimLimit: 10\n")
    assert loading.load(f, {}).config.queue.max_claim_limit == 10


def test_the_config_file_comes_from_the_environment_when_not_given(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("server: {port: 9000}\n")
    assert loading.load(None, {"PRERENDER_CONFIG": str(f)}).config.server.port == 9000


def test_users_need_exactly_one_secret_source() -> None:
    found = problems({"auth": {"users": [{"name": "a", "roles": ["admin"]}]}})
    assert any("needs exactly one of passwordEnv or passwordHash" in p for p in found)
    found = problems({"auth": {"users": [{"name": "a", "roles": ["root"], "passwordEnv": "X"}]}})
    assert any(p.startswith("auth.users.0.roles.0") for p in found)


def test_the_model_round_trips_through_its_own_dump() -> None:
    cfg = parse({"ingress": {"routes": [{"match": "prefix", "path": "/c/", "queryParams": ["p"]}]}}, {}).config
    assert Config.model_validate(cfg.model_dump()) == cfg


@pytest.mark.parametrize("raw, path", [
    ({"management": {"scanCap": 5}}, "management.scan_cap"),
    ({"management": {"backlogSnapshotInterval": "1m"}}, "management.backlog_snapshot_interval"),
    ({"page": {"blobReadBudgetMs": 100}}, "page.blob_read_budget_ms"),
    ({"render": {"orphanSweep": {"dryRun": False}}}, "render.orphan_sweep"),
    ({"scan": {"batchSize": 10, "yieldEvery": 5}}, "scan.batch_size"),
    ({"queue": {"keeper": {"stateInterval": "1s"}}}, "queue.keeper.state_interval"),
])
def test_options_that_would_have_no_effect_are_said_to_be_unsupported(raw, path) -> None:
    # They used to be accepted and documented, and did nothing.
    loaded = loading.parse(raw, {})
    assert f"{path}: not supported by prerender-ray; ignored" in loaded.warnings
