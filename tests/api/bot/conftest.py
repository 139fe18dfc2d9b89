"""The origin site every bot-path module serves from (one per module), and a count of the answers the
hit path negotiates."""

import pytest

from tests.api.origin_site import OriginSite


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()


@pytest.fixture
def prepares(monkeypatch) -> list[str | None]:
    """The Accept-Encoding values the hit path negotiated a page for (each ``prepare`` call)."""
    from prerender_ray.api.bot import hit

    calls: list[str | None] = []
    real = hit.prepare

    def counting(meta, body, accept_encoding, *args):  # type: ignore[no-untyped-def]
        calls.append(accept_encoding)
        return real(meta, body, accept_encoding, *args)

    monkeypatch.setattr(hit, "prepare", counting)
    return calls
