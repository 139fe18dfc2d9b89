"""`up --with-worker`: a worker that could not claim is not started quietly."""

from __future__ import annotations

import os

from prerender_ray.config.loading import parse
from prerender_ray.config.model import Config
from prerender_ray.worker.supervise import TOKEN_ENV, credentials_problem, worker_command

HASH = "pbkdf2_sha256$200000$oSXPlig4O7W6u8gE2junEA==$77yTRtxp3UYqKV3G7Xq0bvHt8ch4FjxayXwMPXdFzXM="


def _cfg(*users: dict) -> Config:
    return Config.model_validate({"auth": {"users": list(users)}})


def test_no_users_needs_no_credentials() -> None:
    assert credentials_problem(_cfg(), {}) is None


def test_users_without_worker_credentials_is_named_with_the_fix() -> None:
    cfg = _cfg({"name": "ops", "passwordHash": HASH, "roles": ["admin"]},
               {"name": "fleet", "passwordHash": HASH, "roles": ["fleet"]})
    problem = credentials_problem(cfg, {})
    assert "PRERENDER_WORKER_USER" in problem and "fleet" in problem
    assert "not one of auth.users" in credentials_problem(cfg, {"PRERENDER_WORKER_USER": "nobody"})
    assert "PRERENDER_WORKER_PASSWORD" in credentials_problem(cfg, {"PRERENDER_WORKER_USER": "fleet"})
    assert credentials_problem(cfg, {"PRERENDER_WORKER_USER": "fleet", "PRERENDER_WORKER_PASSWORD": "x"}) is None


def test_a_user_without_the_fleet_role_is_refused() -> None:
    cfg = _cfg({"name": "viewer", "passwordHash": HASH, "roles": ["viewer"]})
    problem = credentials_problem(cfg, {"PRERENDER_WORKER_USER": "viewer", "PRERENDER_WORKER_PASSWORD": "x"})
    assert "not fleet" in problem and "no user has the fleet role" in problem


SECRETS = {"ORIGIN_TOKEN": "bypass-s3cret", "RN_TOKEN": "render-now-s3cret", "PEER_TOKEN": "peer-s3cret",
           "MQTT_PW": "mqtt-s3cret", "SESSION_KEY": "session-s3cret", "OPS_PW": "ops-s3cret",
           "PRERENDER_WORKER_USER": "fleet", "PRERENDER_WORKER_PASSWORD": "fleet-s3cret",
           "RAY_AUTH_TOKEN": "ray-s3cret", "RAY_AUTH_MODE": "token"}


def test_the_worker_gets_neither_rays_token_nor_the_nodes_other_secrets(monkeypatch) -> None:
    # Before: the worker got all of `up`'s environment, and handed it to Chromium (untrusted pages).
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    cfg = parse({"origin": {"securityToken": {"valueEnv": "ORIGIN_TOKEN"}},
                 "renderNow": {"valueEnv": "RN_TOKEN"}, "peerRescue": {"valueEnv": "PEER_TOKEN"},
                 "fleet": {"mqtt": {"passwordEnv": "MQTT_PW"}},
                 "auth": {"sessionSecretEnv": "SESSION_KEY",
                          "users": [{"name": "ops", "passwordEnv": "OPS_PW", "roles": ["admin"]},
                                    {"name": "fleet", "passwordEnv": "PRERENDER_WORKER_PASSWORD",
                                     "roles": ["fleet"]}]}}).config
    cmd, env = worker_command(cfg, "http://127.0.0.1:1", "/usr/bin/chromium")
    # what the worker itself needs: its fleet password and the bypass token it is told about
    assert env["PRERENDER_WORKER_PASSWORD"] == "fleet-s3cret" and env[TOKEN_ENV] == "bypass-s3cret"
    assert cmd[cmd.index("--password-env") + 1] == "PRERENDER_WORKER_PASSWORD"
    assert cmd[cmd.index("--bypass-token-env") + 1] == TOKEN_ENV
    assert env["PATH"] == os.environ["PATH"]
    assert not [k for k in env if k.startswith("RAY_")]
    assert not {"ORIGIN_TOKEN", "RN_TOKEN", "PEER_TOKEN", "MQTT_PW", "SESSION_KEY", "OPS_PW"} & set(env)
    shown = [v for k, v in env.items() if k not in ("PRERENDER_WORKER_PASSWORD", TOKEN_ENV)]
    assert not [v for v in shown if "s3cret" in v]


def test_a_node_that_fetches_public_hosts_only_starts_its_worker_public_only() -> None:
    open_node = Config.model_validate({"allowAnyDomain": True, "server": {"host": "0.0.0.0"}})
    listed = Config.model_validate({"domains": ["example.com"], "server": {"host": "0.0.0.0"}})
    local = Config.model_validate({"allowAnyDomain": True})  # on loopback: the operator's own machine
    assert "--public-only" in worker_command(open_node, "http://127.0.0.1:1", "/usr/bin/chromium")[0]
    assert "--public-only" not in worker_command(listed, "http://127.0.0.1:1", "/usr/bin/chromium")[0]
    assert "--public-only" not in worker_command(local, "http://127.0.0.1:1", "/usr/bin/chromium")[0]
