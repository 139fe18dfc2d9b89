"""A render result while the node's page log cannot take it (a full disk): the fleet gets a 503 with
``Retry-After`` (its circuit waits, and it posts the identical result again), nothing is stored, the
alert metric is raised; once there is space the retry is answered 204 and served from the log. A
LocalNode: real HTTP, the node's real parts and stores."""

from __future__ import annotations

import errno
import os

import pytest

from prerender_ray.storage.pagelog import PageLogReader, key_hash
from prerender_ray.storage.pagelog.mirror import RETRY_AFTER_S
from prerender_ray.storage.rocks import pagelog_path
from tests.localnode import LocalNode
from tests.support import metric_value, post_result, put_target, take


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = LocalNode.start(tmp_path_factory.mktemp("full") / "data")
    yield d
    d.stop()


def no_space(fd: int, data: bytes, offset: int) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_result_refused_for_a_full_page_log_is_a_503_with_retry_after_and_the_retry_is_stored(node) -> None:
    keys = put_target(node.url, "https://shop.example/full/", nextRenderTime=1)["cacheKeys"]
    job = take(node.url, keys, timeout=15)[keys[0]]
    store = node.parts["store"]
    refused = metric_value(node.url, "prerender_pagelog_refused_total", reason="full")
    store.page_log.writer._write = no_space
    try:
        r = post_result(job, retry_503=False)
        assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S), r.text
        assert "retry later" in r.json()["error"]
        assert metric_value(node.url, "prerender_pagelog_full") == 1
        assert metric_value(node.url, "prerender_pagelog_refused_total", reason="full") == refused + 1
        assert node.run(store.has_pages([job["id"]])) == [False]
    finally:
        store.page_log.writer._write = os.pwrite
    r = post_result(job, retry_503=False)  # the fleet's retry, the same bytes
    assert r.status_code == 204, r.text
    assert metric_value(node.url, "prerender_pagelog_full") == 0
    reader = PageLogReader(pagelog_path(node.data_dir, node.name))
    try:
        assert reader.get(key_hash(job["id"])) is not None
    finally:
        reader.close()
