"""The local Ray a deployment starts: its ports are reserved together."""

from __future__ import annotations

from prerender_ray.actors.deploy import free_ports


def test_the_ports_of_one_start_are_distinct() -> None:
    # Five separate picks could return one port twice (Ray then refuses to start); held together they
    # cannot. Many rounds, since a single round of separate picks collides only rarely.
    for _ in range(200):
        ports = free_ports(5)
        assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)
