"""The command line, end to end: a real local Ray started by `up`, real HTTP, then `down`."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from prerender_ray.actors import deploy
from prerender_ray.cli.main import main as cli_main
from prerender_ray.identity.nodes import RAY_SYSTEM_CONFIG
from prerender_ray.processes import pid_alive
from prerender_ray.worker.supervise import find_chromium
from tests.support import free_port, wait_for

CLI = [sys.executable, "-m", "prerender_ray.cli.main"]


def run(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """The command in this process, for the parts that start nothing (config, checks before `up` starts
    Ray): the exit code and output ``run`` gives, without a Python start of ~0.3 s CPU each.
    ``run`` keeps the real entry point covered (the first test, and every `up`)."""
    capsys.readouterr()
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["prerender-ray", *args], code, out, err)


def one_replica(tmp_path: Path, **config: dict) -> Path:
    """A config with one ingress replica, for the foreground `up`s: each replica is a Ray worker
    process (~1.3 s of CPU to start). The detached `up` keeps the default two, and checks them."""
    f = tmp_path / "prerender.yaml"
    f.write_text(yaml.safe_dump({"server": {"replicas": 1}, **config}))
    return f


def test_config_check_prints_the_effective_config_with_secrets_redacted(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("origin:\n  securityToken:\n    valueEnv: BYPASS_TOKEN\nqueue:\n  maxClaimLimit: 10\n")
    out = run("config", "check", str(f), env={"BYPASS_TOKEN": "hunter2"})
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown["queue"]["max_claim_limit"] == 10
    assert shown["origin"]["security_token"]["value"] == "<set: 7 chars>"
    assert "hunter2" not in out.stdout + out.stderr
    assert "warn: domains" in out.stderr


def test_config_check_never_prints_a_password_hash(tmp_path: Path, capsys) -> None:
    from prerender_ray.admin.users import hash_password

    digest = hash_password("ops-pass", iterations=1000)
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"auth": {"users": [{"name": "ops", "roles": ["admin"], "passwordHash": digest}]}}))
    out = cli(capsys, "config", "check", str(f))
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["auth"]["users"][0]["password_hash"] == "<set>"
    assert digest.rsplit("$", 1)[-1] not in out.stdout + out.stderr
    assert "pbkdf2" not in out.stdout + out.stderr


@pytest.mark.parametrize("text, expected", [
    ("server: [oops\n", "not valid YAML"),
    ("server:\n  port: eighty\n", "server.port: Input should be a valid integer"),
    ("render:\n  defaultInterval: -60000\n", "render.default_interval: Input should be greater than 0"),
    ("ingress:\n  routes:\n    - {match: prefix, path: /a/, deviceTypes: [watch]}\n", "unknown device type"),
    ("domains: ['http://127.0.0.1:29930']\n", "domains entry 'http://127.0.0.1:29930' is a URL; write "
                                              "'127.0.0.1:29930'"),
])
def test_config_check_fails_with_one_line_per_problem(tmp_path: Path, capsys, text: str, expected: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    out = cli(capsys, "config", "check", str(f))
    assert out.returncode == 1
    assert expected in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_config_check_explains_what_each_domains_entry_allows(tmp_path: Path, capsys) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("domains: [Shop.Test, '127.0.0.1:8080', '[::1]:*']\n")
    out = cli(capsys, "config", "check", str(f))
    assert out.returncode == 0, out.stderr
    assert "domains: 'shop.test' allows shop.test: http on port 80 and https on port 443 only" in out.stderr
    assert "domains: '127.0.0.1:8080' allows 127.0.0.1: http and https on port 8080 only" in out.stderr
    assert "domains: '[::1]:*' allows [::1]: http and https on any port" in out.stderr


def test_config_check_shows_the_discovery_budget_an_operator_gets(tmp_path: Path, capsys) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("domains: [shop.test]\nbots: {classes: {other: {discover: false}}}\n")
    out = cli(capsys, "config", "check", str(f))
    assert out.returncode == 0, out.stderr
    assert "at most 60 new targets per site and minute on each node (30 per ingress replica, 2 replicas)" in out.stderr
    assert "at most 1000 discovered targets per site wait for their first render" in out.stderr
    assert "discovery: off by policy for class other" in out.stderr
    assert yaml.safe_load(out.stdout)["bots"]["discovery"] == {"per_minute": 60, "max_unrendered": 1000}


def test_config_check_warns_where_a_saved_robots_txt_disallows_a_served_bot(tmp_path: Path, capsys) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("domains: [shop.test]\n")
    robots = tmp_path / "robots.txt"
    robots.write_bytes(b"User-agent: GPTBot\nDisallow: /\n\nUser-agent: *\nAllow: /\n")
    out = cli(capsys, "config", "check", str(f), "--robots", str(robots))
    assert out.returncode == 0, out.stderr
    assert (f"warn: robots.txt {robots}: robots.txt disallows / to GPTBot, but the policy serves it "
            "(prerender)") in out.stderr
    assert "to Googlebot" not in out.stderr
    assert cli(capsys, "config", "check", str(f), "--robots", str(tmp_path / "missing.txt")).returncode == 1


def test_config_defaults_prints_a_config_that_loads_back(tmp_path: Path, capsys) -> None:
    out = cli(capsys, "config", "defaults", "--camel")
    assert out.returncode == 0
    f = tmp_path / "d.yaml"
    f.write_text(out.stdout)
    assert cli(capsys, "config", "check", str(f)).returncode == 0
    assert "jobLeaseTime: 600000" in out.stdout


def test_up_refuses_bad_input_before_starting_anything(tmp_path: Path, capsys, monkeypatch) -> None:
    def started(*_: object, **__: object) -> None:
        raise AssertionError("`up` went on to start Ray")

    monkeypatch.setattr(deploy, "start_local_ray", started)
    monkeypatch.setattr(deploy, "connect", started)
    bad = tmp_path / "bad.yaml"
    bad.write_text("queue: {jobLeaseTime: 5}\n")
    data = tmp_path / "data"
    out = cli(capsys, "up", "--config", str(bad), "--data-dir", str(data), "--detach")
    assert out.returncode == 2
    assert "queue.job_lease_time" in out.stderr
    assert not (data / deploy.RECORD).exists()

    blocker = tmp_path / "file"
    blocker.write_text("")
    out = cli(capsys, "up", "--data-dir", str(blocker / "data"), "--detach")
    assert out.returncode == 2 and "not writable" in out.stderr

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = cli(capsys, "up", "--data-dir", str(data), "--port", str(port), "--detach")
    assert out.returncode == 1 and f"port {port}" in out.stderr and "in use" in out.stderr
    assert not (data / deploy.RECORD).exists()


def ray_system_configs(pids: list[int]) -> list[dict]:
    """The system config each GCS server among ``pids`` was started with (Ray passes it base64 JSON)."""
    found = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if argv and argv[0].endswith("gcs_server"):
            found += [json.loads(base64.b64decode(a.split("=", 1)[1]))
                      for a in argv if a.startswith("--config_list=")]
    return found


def test_up_serves_status_reports_and_down_leaves_nothing_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    out = run("up", "--data-dir", str(data), "--port", str(port), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr
    base = f"http://127.0.0.1:{port}"
    assert base in out.stdout
    record = deploy.Record.read(data)
    assert record is not None and record.owns_ray
    try:
        assert httpx.get(f"{base}/healthz").json()["ok"] is True
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.json()["keeper"]["phase"] == "live"
        metrics = httpx.get(f"{base}/metrics").text
        assert "prerender_keeper_live 1.0" in metrics

        st = run("status", "--data-dir", str(data), "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        [node] = status["nodes"]
        assert node["url"] == base and node["healthy"] is True
        assert node["keeper"]["state"] == "live" and node["keeper"]["rows"] == 0
        assert node["ingressReplicas"] == {"up": 2, "configured": 2}
        assert node["leasesInFlight"] == 0
        assert node["queueStatus"] in ("empty", "unready")
        running = deploy.our_processes(record, data)
        assert running, "expected the deployment's processes to be found"
        [gcs_config] = ray_system_configs(running)
        assert gcs_config.items() >= RAY_SYSTEM_CONFIG.items(), gcs_config

        again = run("up", "--data-dir", str(data), "--port", str(free_port()), "--detach")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = run("down", "--data-dir", str(data))
    assert down.returncode == 0, down.stderr
    assert re.search(r"^\S+: drained in [\d.]+s", down.stdout, re.M), down.stdout  # nothing was granted
    assert deploy.our_processes(record, data) == []
    assert deploy.port_free("127.0.0.1", port)
    assert not (data / deploy.RECORD).exists()
    after = run("status", "--data-dir", str(data), "--json")
    assert after.returncode == 1 and json.loads(after.stdout)["healthy"] is False


@contextlib.contextmanager
def foreground_up(data: Path, port: int, *args: str,
                  until: str = "ready") -> Iterator[tuple[subprocess.Popen, deploy.Record, str]]:
    """`up` in the foreground, as `make run` starts it, once it has printed ``until``; whatever
    the test leaves running is stopped afterwards."""
    proc = subprocess.Popen([*CLI, "up", "--data-dir", str(data), "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        out = ""
        while time.monotonic() < deadline and until not in out:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            out += line
        assert until in out, out
        record = deploy.Record.read(data)
        assert record is not None and record.owns_ray
        # each probe gives the node's actors 2 s to answer: on a loaded machine one can be late
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200,
                 timeout=30, what="/readyz after `up` said it was ready")
        yield proc, record, out
    finally:
        if proc.poll() is None:
            proc.kill()
            try:  # what it started may still hold its output pipe open: never wait on that for good
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.stdout.close()
        if (data / deploy.RECORD).exists():
            run("down", "--data-dir", str(data))


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """What the foreground `up` printed until it exited."""
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`up` still running after {timeout:g}s")
    return rest


def assert_nothing_left(record: deploy.Record, data: Path, port: int) -> None:
    left = {pid: describe(pid) for pid in deploy.our_processes(record, data)}
    assert left == {}
    deadline = time.monotonic() + 5  # a process killed just now releases its socket a moment later
    while not deploy.port_free("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert deploy.port_free("127.0.0.1", port)
    assert not (data / deploy.RECORD).exists()


def describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "(gone)"


def test_a_foreground_up_steps_aside_when_down_runs_in_another_shell(tmp_path: Path) -> None:
    # Before: `up` sat on until Ray's GCS reconnect timeout aborted it (exit 1, a minute later),
    # leaving its render worker (own session) claiming from a node that was gone.
    if find_chromium() is None:
        pytest.skip("no Chromium: the render worker would not start")
    data, port = tmp_path / "data", free_port()
    with foreground_up(data, port, "--with-worker", "--config", str(one_replica(tmp_path)),
                       until="render worker: pid") as (proc, record, out):
        worker = int(re.search(r"render worker: pid (\d+)", out).group(1))
        try:
            assert pid_alive(worker)
            (data / deploy.RECORD).unlink()  # by hand: `up` writes it back, `down` needs it
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (data / deploy.RECORD).exists():
                time.sleep(0.1)
            assert deploy.Record.read(data) == record
            down = run("down", "--data-dir", str(data))
            assert down.returncode == 0, down.stderr
            out = finish(proc, timeout=60)
            worker_left = pid_alive(worker)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "stopped by `prerender-ray down`" in out
    assert "GCS" not in out
    assert not worker_left
    assert_nothing_left(record, data, port)


def test_piped_output_is_json_lines_logs_reads_them_a_missing_worker_login_is_said_and_ctrl_c_stops_all(
        tmp_path: Path) -> None:
    # Before: Ray's "(Controller pid=...)" prefixes and colour codes on every line, most keeper
    # lines without a node, a "membership push failed" on every start, and no way to read the logs;
    # and with users but no worker credentials the worker started anyway and got 401 in a loop,
    # nothing rendered, nothing said. One start of a local Ray for all of it (each costs the suite
    # ~45 s of CPU on two cores).
    data, port = tmp_path / "data", free_port()
    config = one_replica(tmp_path, auth={"users": [
        {"name": "ops", "passwordHash": "pbkdf2_sha256$200000$oSXPlig4O7W6u8gE2junEA==$"
                                        "77yTRtxp3UYqKV3G7Xq0bvHt8ch4FjxayXwMPXdFzXM=", "roles": ["admin"]}]})
    env_user = os.environ.pop("PRERENDER_WORKER_USER", None)
    chromium = find_chromium() is not None
    try:
        with foreground_up(data, port, *(("--with-worker",) if chromium else ()), "--config", str(config),
                           until="starting without a render worker" if chromium else "ready") as (proc, record, out):
            shown = run("logs", "--data-dir", str(data))
            keeper = run("logs", "--data-dir", str(data), "--node", _node_name(data))
            proc.send_signal(signal.SIGINT)
            out += finish(proc, timeout=120)
    finally:
        if env_user is not None:
            os.environ["PRERENDER_WORKER_USER"] = env_user
    assert proc.returncode == 0, out
    if chromium:
        assert "PRERENDER_WORKER_USER" in out and "render worker: pid" not in out
    assert "stopping ..." in out and "stopped" in out
    assert "draining: the queue says paused" in out and re.search(r"^\S+: drained in [\d.]+s", out, re.M), out
    assert_nothing_left(record, data, port)
    assert "\x1b[" not in out and "pid=" not in out, out
    assert "membership push failed" not in out, out
    assert f"console: http://127.0.0.1:{port}/prerender_admin/" in out
    ours = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert {"controller", "keeper", "store", "leases", "ingress-0"} <= {d["process"] for d in ours}
    assert all(d.get("node") for d in ours), [d for d in ours if not d.get("node")]
    assert shown.returncode == 0
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(d["event"] == "keeper live" for d in lines)
    assert {d["process"] for d in (json.loads(x) for x in keeper.stdout.splitlines())} >= {"keeper", "store"}
    assert "controller" not in {d["process"] for d in (json.loads(x) for x in keeper.stdout.splitlines())}


def _node_name(data: Path) -> str:
    [node] = [p.name for p in (data / "nodes").iterdir() if (p / "logs").is_dir()]
    return node


def test_a_foreground_up_cleans_up_and_fails_when_its_local_ray_dies(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    with foreground_up(data, port, "--config", str(one_replica(tmp_path))) as (proc, record, _):
        assert record.ray_pid is not None
        os.killpg(record.ray_pid, signal.SIGKILL)
        out = finish(proc, timeout=60)
    assert proc.returncode == 1, out
    assert "the local Ray exited unexpectedly" in out
    assert_nothing_left(record, data, port)


def test_the_start_message_names_a_command_that_runs_from_where_up_was_started(tmp_path: Path, monkeypatch) -> None:
    """Before: it said `prerender-ray logs`, which is not on PATH after the Quickstart's install
    (``.venv/bin/prerender-ray`` is)."""
    from prerender_ray.cli.main import self_command

    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    script = venv_bin / "prerender-ray"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert self_command(".venv/bin/prerender-ray") == ".venv/bin/prerender-ray"
    assert self_command(str(script)) == ".venv/bin/prerender-ray"
    monkeypatch.chdir(venv_bin)
    assert self_command(str(script)) == "./prerender-ray"  # a bare name would be looked up on PATH
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert self_command(str(script)) == str(script)
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")  # an activated venv
    assert self_command(str(script)) == "prerender-ray"
    assert self_command("/src/cli/main.py") == f"{sys.executable} -m prerender_ray.cli.main"
    installed = Path(sys.executable).parent / "prerender-ray"  # this venv's script: what is named runs
    monkeypatch.chdir(installed.parents[2])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    named = self_command(str(installed))
    assert named == f"{installed.parent.parent.name}/bin/prerender-ray"
    done = subprocess.run([*shlex.split(named), "logs", "--data-dir", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no logs under" in done.stderr
