"""The local Ray a deployment starts: its ports are reserved together."""

from __future__ import annotations

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
