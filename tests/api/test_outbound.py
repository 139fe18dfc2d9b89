"""Where the outbound clients connect (api/outbound.py): a public-only backend checks every address
its host resolves to and connects to the one it checked; staging pins one IP. Real HTTP on 127.0.0.1
stands in for a public origin: the resolver is the test's, the connection is real."""

from __future__ import annotations

import asyncio

import httpcore
import httpx
import pytest

from prerender_ray.api.outbound import NonPublicAddress, PublicOnlyBackend, transport
from tests.api.origin_site import OriginSite

PUBLIC = "93.184.216.34"


class Redirected(httpcore.AnyIOBackend):
    """The network beneath: records where it was asked to connect, and connects to 127.0.0.1."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, int]] = []

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # type: ignore[no-untyped-def]
        self.asked.append((host, port))
        return await super().connect_tcp("127.0.0.1", port, timeout, local_address, socket_options)


def resolver(*answers: list[str]):  # type: ignore[no-untyped-def]
    """Answers each look-up with the next list (a name that resolves again to another address)."""
    left = list(answers)
    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return left.pop(0)

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()


async def test_a_public_host_is_connected_to_at_the_address_checked_with_its_own_name(site) -> None:
    net = Redirected()
    pool = transport(public_only=True, backend=net, resolve=resolver([PUBLIC, "2606:2800:220:1:248:1893:25c8:1946"]))
    async with httpx.AsyncClient(transport=pool, trust_env=False) as client:
        r = await client.get(f"http://origin.example:{site.port}/page/x")
    assert r.status_code == 200
    assert net.asked == [(PUBLIC, site.port)]
    assert site.last("/page/x").headers["host"] == f"origin.example:{site.port}"


@pytest.mark.parametrize("answer", [["10.0.0.7"], [PUBLIC, "169.254.169.254"], ["::1"], ["::ffff:127.0.0.1"],
                                    ["fd00::1"], ["100.64.0.1"], ["0.0.0.0"]])
async def test_a_host_with_any_address_outside_the_public_internet_is_refused(answer) -> None:
    net = Redirected()
    backend = PublicOnlyBackend(net, resolver(answer))
    with pytest.raises(NonPublicAddress) as e:
        await backend.connect_tcp("rebind.example", 80, timeout=1.0)
    assert net.asked == [] and "rebind.example does not resolve to public addresses only" in str(e.value)
    assert str(e.value).count(".") == 1 and ":" not in str(e.value).split("(")[0]  # no address named
    assert e.value.detail == f"it resolves to {next(a for a in answer if a != PUBLIC)}"


async def test_each_connection_is_checked_anew_so_a_rebound_name_is_refused() -> None:
    net = Redirected()
    resolve = resolver([PUBLIC], ["127.0.0.1"])
    backend = PublicOnlyBackend(net, resolve)
    with pytest.raises(httpcore.ConnectError):  # the first, public: connected (nothing listens on 9)
        await backend.connect_tcp("rebind.example", 9, timeout=1.0)
    with pytest.raises(NonPublicAddress):
        await backend.connect_tcp("rebind.example", 9, timeout=1.0)
    assert net.asked == [(PUBLIC, 9)] and resolve.asked == ["rebind.example"] * 2  # type: ignore[attr-defined]


async def test_a_lookup_that_fails_is_refused_alike_and_one_that_hangs_ends_at_the_deadline() -> None:
    # A name the node's DNS does not know is refused in the same words as a private one: a bot learns
    # nothing of the node's own network from the answer.
    async def fails(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    async def hangs(host: str, port: int) -> list[str]:
        await asyncio.sleep(30)
        return [PUBLIC]

    answers = []
    for host, resolve in (("nx.example", fails), ("none.example", resolver([])), ("db.internal", resolver(["10.0.0.9"]))):
        with pytest.raises(NonPublicAddress) as e:
            await PublicOnlyBackend(Redirected(), resolve).connect_tcp(host, 80, timeout=1.0)
        answers.append(str(e.value).replace(host, "HOST"))
    assert len(set(answers)) == 1
    with pytest.raises(httpcore.ConnectTimeout):
        await PublicOnlyBackend(Redirected(), hangs).connect_tcp("slow.example", 80, timeout=0.05)


async def test_each_checked_address_is_tried_in_turn(site) -> None:
    class FirstUnreachable(Redirected):
        async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # type: ignore[no-untyped-def]
            if host == PUBLIC:
                self.asked.append((host, port))
                raise httpcore.ConnectError("Network is unreachable")
            return await super().connect_tcp(host, port, timeout, local_address, socket_options)

    net = FirstUnreachable()
    pool = transport(public_only=True, backend=net, resolve=resolver([PUBLIC, "2606:4700::1111"]))
    async with httpx.AsyncClient(transport=pool, trust_env=False) as client:
        assert (await client.get(f"http://dual.example:{site.port}/page/x")).status_code == 200
    assert net.asked == [(PUBLIC, site.port), ("2606:4700::1111", site.port)]


async def test_a_unix_socket_is_never_connected_to() -> None:
    with pytest.raises(httpcore.ConnectError):
        await PublicOnlyBackend(Redirected()).connect_unix_socket("/run/docker.sock")


async def test_staging_pins_every_connection_to_its_ip(site) -> None:
    net = Redirected()
    async with httpx.AsyncClient(transport=transport(pin="192.0.2.10", backend=net), trust_env=False) as client:
        r = await client.get(f"http://shop.example:{site.port}/page/x")
    assert r.status_code == 200 and net.asked == [("192.0.2.10", site.port)]
