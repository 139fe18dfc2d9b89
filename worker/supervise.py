"""``prerender-ray up --with-worker``: a render worker as a child process of the foreground ``up``,
pointed at the node it started, stopped with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

from prerender_ray.config.loading import secret_env_vars
from prerender_ray.serving.origin_policy import OriginPolicy
from prerender_ray.worker.options import default_concurrency, find_chromium

TOKEN_ENV = "PRERENDER_WORKER_BYPASS_TOKEN"
STOP_GRACE_S = 25.0  # the worker's drain (12 s) + closing Chromium, with room


def worker_command(cfg: Any, queue_url: str, chromium: str) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment for a node configured by ``cfg`` (a prerender_ray Config)."""
    cmd = [
        sys.executable,
        "-m",
        "prerender_ray.worker",
        "--queue",
        queue_url,
        "--chromium",
        chromium,
        "--concurrency",
        str(default_concurrency()),
        "--exit-with-parent",
        "--trailing-slash",
        cfg.cache_key.trailing_slash,
    ]
    if cfg.cache_key.plus_is_space:
        cmd.append("--plus-is-space")
    if OriginPolicy(cfg).public_only:  # anyone may name the page: its browser connects as the node does
        cmd.append("--public-only")
    # The worker is no Ray process and needs none of the node's secrets but the two it is given below;
    # it would only carry them to Chromium and the pages it renders.
    drop = secret_env_vars(cfg) - {"PRERENDER_WORKER_PASSWORD"}
    env = {k: v for k, v in os.environ.items()
           if k != "PROMETHEUS_MULTIPROC_DIR" and not k.startswith("RAY_") and k not in drop}
    token = cfg.origin.security_token
    if token.value:
        cmd += ["--bypass-header", token.header, "--bypass-token-env", TOKEN_ENV]
        env[TOKEN_ENV] = token.value
    if env.get("PRERENDER_WORKER_USER"):
        cmd += ["--user", env["PRERENDER_WORKER_USER"]]
        if env.get("PRERENDER_WORKER_PASSWORD"):
            cmd += ["--password-env", "PRERENDER_WORKER_PASSWORD"]
    return cmd, env


def credentials_problem(cfg: Any, env: dict[str, str]) -> str | None:
    """Why a worker started with ``env`` could not claim from a node configured by ``cfg``, or None.
    With ``auth.users`` set every claim needs a user with the fleet (or admin) role: without one the
    worker would get 401 in a loop and render nothing."""
    users = cfg.auth.users
    if not users:
        return None  # loopback without users: the node trusts its own machine
    name = env.get("PRERENDER_WORKER_USER", "")
    fleet = [u.name for u in users if {"fleet", "admin"} & set(u.roles)]
    hint = f" (users with the fleet role: {', '.join(fleet)})" if fleet else " (no user has the fleet role)"
    if not name:
        return ("auth.users is set, so the render queue needs credentials: set PRERENDER_WORKER_USER and "
                "PRERENDER_WORKER_PASSWORD to a user with the fleet role" + hint)
    user = next((u for u in users if u.name == name), None)
    if user is None:
        return f"PRERENDER_WORKER_USER={name!r} is not one of auth.users" + hint
    if not {"fleet", "admin"} & set(user.roles):
        return f"user {name!r} has roles {user.roles}, not fleet" + hint
    if not env.get("PRERENDER_WORKER_PASSWORD"):
        return f"PRERENDER_WORKER_PASSWORD is not set (the password of {name!r})"
    return None


def start_worker(cfg: Any, queue_url: str) -> subprocess.Popen | None:
    """Start the worker (in its own session, so a terminal's Ctrl-C reaches it once, through us);
    None with a message when no Chromium is installed or the worker could not claim."""
    problem = credentials_problem(cfg, dict(os.environ))
    if problem is not None:
        print(f"prerender-ray: {problem}; starting without a render worker", file=sys.stderr, flush=True)
        return None
    chromium = find_chromium()
    if chromium is None:
        print(
            "prerender-ray: no Chromium found (apt install chromium); starting without a render worker",
            file=sys.stderr,
        )
        return None
    cmd, env = worker_command(cfg, queue_url, chromium)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"render worker: pid {proc.pid}, claiming from {queue_url} with {chromium}", flush=True)
    return proc


def stop_worker(proc: subprocess.Popen | None, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (a graceful drain), then SIGKILL after ``grace_s``; always reaped."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
