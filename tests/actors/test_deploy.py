"""The local Ray a deployment starts: its ports are reserved together."""

from __future__ import annotations

import os

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
