"""The uvicorn server of an ingress replica (api/server.py): the connection cap its open-file limit
allows, and plain HTTP only (no WebSocket protocol outside the guarded one)."""

from __future__ import annotations

from prerender_ray.api.server import connection_budget
from tests.api.live_server import connect, request, response, serving
from tests.api.test_connections import App, config


async def test_a_websocket_upgrade_is_answered_as_plain_http_by_the_guarded_protocol() -> None:
    """With uvicorn's default (ws auto, the websockets package installed) an upgrade handed the
    connection to its WebSocket protocol, outside the cap, the deadlines and the head bounds."""
    app = App()
    async with serving(app, config()) as port:
        r, w = await connect(port)
        w.write(request(extra="upgrade: websocket\r\nconnection: Upgrade\r\n"
                              "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"))
        assert await response(r) == (200, b"ok")
        w.close()


def test_the_cap_fits_the_open_file_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_budget(100) == 100
    if hard != resource.RLIM_INFINITY:
        assert connection_budget(hard) == hard // 2  # lowered: half the descriptors stay free
