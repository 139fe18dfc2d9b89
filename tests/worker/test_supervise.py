"""`up --with-worker`: a worker that could not claim is not started quietly."""

from __future__ import annotations

from prerender_ray.config.model import Config
from prerender_ray.worker.supervise import credentials_problem

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
