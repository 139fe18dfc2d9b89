"""The local Ray a deployment starts: its ports are reserved together."""

from __future__ import annotations

import os
import stat

import pytest

from prerender_ray.actors.deploy import free_ports


def test_the_ports_of_one_start_are_distinct() -> None:
    # Five separate picks could return one port twice (Ray then refuses to start); held together they
    # cannot. Many rounds, since a single round of separate picks collides only rarely.
    for _ in range(200):
        ports = free_ports(5)
        assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)


def test_a_quiet_driver_prints_no_raylet_error_lines() -> None:
    """Before: `up` (log_to_driver off) still printed Ray's coloured "(raylet) A worker died ..." into
    its JSON lines as it stopped the actors; this is the path those lines take in a driver."""
    import io

    import ray._private.worker as ray_worker

    from prerender_ray.actors.deploy import quiet_driver

    raylet = {"lines": ["A worker died or was killed while executing a task"], "pid": "raylet", "is_err": False}
    before = ray_worker._worker_logs_enabled
    try:
        ray_worker._worker_logs_enabled = True
        loud = io.StringIO()
        ray_worker.print_worker_logs(raylet, loud)
        assert "A worker died" in loud.getvalue()  # what the driver prints unless quieted
        quiet_driver()
        quiet = io.StringIO()
        ray_worker.print_worker_logs(raylet, quiet)
        assert quiet.getvalue() == ""
    finally:
        ray_worker._worker_logs_enabled = before


# Loaded by every Python process of the Ray it is given to: the first dashboard agent sleeps past the
# raylet's fixed 15 s wait for its ports, as an agent's imports do on a busy machine; later ones do not.
SLOW_FIRST_AGENT = """
import os, pathlib, time
if b"dashboard/agent.py" in pathlib.Path("/proc/self/cmdline").read_bytes():
    try:
        os.close(os.open(os.environ["SLOW_AGENT_MARK"], os.O_CREAT | os.O_EXCL))
        time.sleep(20)
    except FileExistsError:
        pass
"""


def test_a_start_whose_raylet_gives_up_on_a_slow_agent_is_made_once_more(tmp_path, monkeypatch) -> None:
    """Before: `up` failed with "Ray did not start (exit 1)" (twice in CI): Ray 2.60's raylet aborts when
    its dashboard agent takes over 15 s to report its ports, and `ray start` then exits."""
    from prerender_ray.actors import deploy

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_FIRST_AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SLOW_AGENT_MARK", str(tmp_path / "slowed"))
    notes: list[str] = []
    record = deploy.start_local_ray(tmp_path / "data", "e1", note=notes.append)
    try:
        assert (tmp_path / "slowed").exists()  # the first start's agent was the slow one
        assert notes == ["Ray's raylet gave up waiting for its agents to start (a busy machine); "
                         "starting Ray once more"]
        assert deploy.local_ray_alive(record) and record.address.startswith("127.0.0.1:")
        log = (tmp_path / "data" / "ray" / "ray-start.log").read_text()
        assert log.count("Local node IP") == 2  # two starts, one log
    finally:
        deploy.stop_local_ray(record)
    assert deploy._strays(record.temp_dir) == []


class _Stop(Exception):
    pass


def _token_file_made_by_a_start(tmp_path, monkeypatch):
    """What start_local_ray leaves of the token file, stopped just before it would start Ray."""
    from prerender_ray.actors import deploy

    def no_ray(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(deploy, "_ray_start", no_ray)
    with pytest.raises(_Stop):
        deploy.start_local_ray(tmp_path / "data", "e1")
    return tmp_path / "data" / "ray" / "auth_token"


def test_a_new_ray_token_file_is_readable_by_its_owner_only(tmp_path, monkeypatch) -> None:
    old = os.umask(0)  # the most permissive umask: the file's mode must not come from it
    try:
        token_file = _token_file_made_by_a_start(tmp_path, monkeypatch)
    finally:
        os.umask(old)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(token_file.read_text()) == 64
    assert [p.name for p in token_file.parent.iterdir()] == ["auth_token"]  # no temporary file left


def test_a_ray_token_file_left_readable_by_others_is_made_owner_only(tmp_path, monkeypatch) -> None:
    # Before: a token file with looser modes (an older version, a copy) kept them for good.
    token_file = tmp_path / "data" / "ray" / "auth_token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text("ab" * 32)
    token_file.chmod(0o644)
    assert _token_file_made_by_a_start(tmp_path, monkeypatch) == token_file
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text() == "ab" * 32  # the deployment keeps its token
