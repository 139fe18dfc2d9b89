"""The origin site every bot-path module serves from (one per module)."""

import pytest

from tests.api.origin_site import OriginSite


@pytest.fixture(scope="module")
def site():
    s = OriginSite().start()
    yield s
    s.stop()
