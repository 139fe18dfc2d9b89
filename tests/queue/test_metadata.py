"""A posted result's metadata: validation, what is forwarded to the keeper, and the legacy inference of
an outcome the fleet did not send (docs/fleet-protocol.md#metadata-fields)."""

from __future__ import annotations

from typing import Any

import pytest

from prerender_ray.queue.metadata import Result, ResultError, forwarded, resolve_outcome

SRC = "https://shop.test/old"
KEY = f"{SRC}|desktop"
DST = "https://shop.test/new"


def result(content: bytes | None = None, **meta: Any) -> Result:
    return Result.parse({"id": KEY, "url": SRC, **meta}, content)


# ------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("meta", [None, [], "x", 5, [{"id": KEY}]])
def test_metadata_that_is_not_an_object_is_refused(meta: Any) -> None:
    with pytest.raises(ResultError, match="metadata must be a JSON object"):
        Result.parse(meta, None)


@pytest.mark.parametrize("meta", [{}, {"id": ""}, {"id": 5}, {"id": None}, {"id": ["a|desktop"]}])
def test_metadata_without_a_job_id_is_refused(meta: dict) -> None:
    with pytest.raises(ResultError, match="metadata.id"):
        Result.parse(meta, None)


@pytest.mark.parametrize("outcome", ["exploded", "", "RENDERED", 1, ["rendered"]])
def test_an_unknown_outcome_is_refused(outcome: Any) -> None:
    with pytest.raises(ResultError, match="unknown outcome"):
        Result.parse({"id": KEY, "outcome": outcome}, None)


@pytest.mark.parametrize("headers", [["content-type"], "content-type: text/html", 5])
def test_headers_that_are_not_an_object_are_refused(headers: Any) -> None:
    with pytest.raises(ResultError, match="headers"):
        Result.parse({"id": KEY, "headers": headers}, None)


def test_a_result_error_is_a_value_error_for_the_http_layer() -> None:
    assert issubclass(ResultError, ValueError)


def test_a_minimal_result_parses_with_every_optional_field_absent() -> None:
    r = Result.parse({"id": KEY}, None)
    assert r.id == KEY and r.url == "" and r.outcome == "" and r.headers == {}
    assert r.status_code is None and r.is_indexable is None and r.redirected_to is None
    assert r.reason is None and r.error is None and r.render_time is None and r.content is None
    assert r.content_encoding == "identity"


def test_header_names_are_lowercased_and_absent_values_dropped() -> None:
    r = Result.parse(
        {"id": KEY, "headers": {"Content-Type": "text/html", "ETag": '"1"', "Vary": None, "X-Count": 3}}, None
    )
    assert r.headers == {"content-type": "text/html", "etag": '"1"', "x-count": "3"}


@pytest.mark.parametrize("value, expected", [(200, 200), (100, 100), (599, 599), (301.0, 301), (None, None)])
def test_the_status_code_is_an_integer_from_100_to_599_or_absent(value: Any, expected: int | None) -> None:
    assert Result.parse({"id": KEY, "statusCode": value}, None).status_code == expected


@pytest.mark.parametrize("value", [99999, -1, 0, 99, 600, 1e300, 200.5, float("nan"), float("inf"), True,
                                   False, "200", "", "abc", [200], {"code": 200}])
def test_a_status_code_out_of_range_or_not_a_number_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ResultError, match="statusCode"):
        Result.parse({"id": KEY, "statusCode": value}, None)


@pytest.mark.parametrize("status", [100, 101, 103, 199, 204, 205, 304])
@pytest.mark.parametrize("outcome", ["rendered", None])
def test_content_with_a_status_that_carries_none_is_refused_by_name(status: int, outcome: str | None) -> None:
    """Stored, such a page was served as a status line, a length and a body a client reads as the
    next response (the reference fleet posts content with 200 only)."""
    meta = {"id": KEY, "statusCode": status, "isIndexable": True, **({"outcome": outcome} if outcome else {})}
    with pytest.raises(ResultError, match=f"metadata.statusCode {status} carries no content"):
        Result.parse(meta, b"<html>x</html>")


@pytest.mark.parametrize("status", [100, 204, 304])
def test_a_status_that_carries_no_content_is_taken_without_content(status: int) -> None:
    assert Result.parse({"id": KEY, "statusCode": status, "outcome": "error"}, None).status_code == status


@pytest.mark.parametrize("value", [0, 800, 1500.5, 86_400_000])
def test_a_render_time_is_a_finite_non_negative_number_of_milliseconds(value: Any) -> None:
    assert Result.parse({"id": KEY, "renderTime": value}, None).render_time == value


@pytest.mark.parametrize("value", [-1, 86_400_001, 1e300, float("nan"), float("-inf"), True, "1500", "fast",
                                   [1]])
def test_a_render_time_out_of_range_or_not_a_number_is_refused_by_name(value: Any) -> None:
    with pytest.raises(ResultError, match="renderTime"):
        Result.parse({"id": KEY, "renderTime": value}, None)


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), (None, None)])
def test_is_indexable_is_a_real_boolean(value: Any, expected: bool | None) -> None:
    assert Result.parse({"id": KEY, "isIndexable": value}, None).is_indexable is expected


@pytest.mark.parametrize("field, value", [
    ("isIndexable", "false"), ("isIndexable", 0), ("reason", 5), ("reason", "x" * 201), ("error", "boom"),
    ("error", ["TimeoutError"]), ("redirectedTo", 7), ("redirectedTo", "https://x.test/" + "a" * 70_000),
    ("url", {"href": SRC}), ("url", 5),
])
def test_a_field_of_the_wrong_type_or_size_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ResultError, match=f"metadata.{field}"):
        Result.parse({"id": KEY, field: value}, None)


@pytest.mark.parametrize("headers", [{"etag": {"v": 1}}, {"ETag": ["a"]}, {"vary": True},
                                     {"link": "<a>; rel=x\r\nSet-Cookie: s=1"}, {"etag": "x\0"},
                                     {"cache-control": "x" * 8193}])
def test_a_header_value_that_is_no_text_or_could_split_a_response_is_refused(headers: dict) -> None:
    with pytest.raises(ResultError, match="metadata.headers"):
        Result.parse({"id": KEY, "headers": headers}, None)


def test_empty_optional_fields_read_as_absent() -> None:
    r = Result.parse({"id": KEY, "redirectedTo": "", "reason": None, "error": None, "renderTime": None}, b"")
    assert r.redirected_to is None and r.reason is None and r.error is None and r.render_time is None
    assert r.content is None  # an empty body is no content
    r = Result.parse({"id": KEY, "error": {"name": "TimeoutError"}, "renderTime": 1500}, b"x")
    assert r.redirected_to is None and r.error == {"name": "TimeoutError"} and r.render_time == 1500
    assert r.content == b"x"


def test_only_the_fields_and_headers_the_keeper_reads_are_forwarded() -> None:
    meta = {"id": KEY, "url": SRC, "statusCode": 200, "renderSummary": {"errors": 0}, "futureField": "x" * 1000,
            "headers": {"ETag": '"1"', "content-encoding": "gzip", "Set-Cookie": "s=1", "x-huge": "y" * 1000}}
    sent = forwarded(meta)
    assert sent == {"id": KEY, "url": SRC, "statusCode": 200, "renderSummary": {"errors": 0},
                    "headers": {"ETag": '"1"', "content-encoding": "gzip"}}
    parsed, whole = Result.parse(sent, b"x"), Result.parse(meta, b"x")
    assert parsed.headers == {k: v for k, v in whole.headers.items() if k in ("etag", "content-encoding")}


def test_the_content_encoding_comes_from_the_posted_headers() -> None:
    assert (
        Result.parse({"id": KEY, "headers": {"Content-Encoding": " GZIP "}}, b"x").content_encoding == "gzip"
    )
    assert Result.parse({"id": KEY, "headers": {}}, b"x").content_encoding == "identity"


# ------------------------------------------------------------------------------ legacy inference


def legacy(content: bytes | None = None, **meta: Any) -> Result:
    return result(content, **meta)


@pytest.mark.parametrize(
    "r, indexable, expected",
    [
        (legacy(b"<html/>", statusCode=200), None, "rendered"),
        (legacy(None, statusCode=200, isIndexable=True), True, "rendered"),  # an isIndexable-only result
        (legacy(b"<html/>", statusCode=200, redirectedTo=DST), None, "rendered"),  # first match wins
        (legacy(None, statusCode=301, redirectedTo=DST), None, "redirected"),
        (legacy(None, statusCode=200, isIndexable=False), False, "non-indexable"),
        (legacy(b"<html/>", statusCode=404), None, "error"),  # content without a 200 is not a render
        (legacy(None), None, "error"),
    ],
)
def test_a_result_without_an_outcome_is_inferred_like_the_reference(
    r: Result, indexable: bool | None, expected: str
) -> None:
    assert resolve_outcome(r, indexable) == expected


def test_a_posted_outcome_is_never_second_guessed() -> None:
    r = result(None, outcome="error", statusCode=200, isIndexable=True)
    assert resolve_outcome(r, True) == "error"


def test_the_inference_uses_the_domain_coerced_verdict() -> None:
    r = legacy(None, statusCode=200, isIndexable=True)
    assert resolve_outcome(r, False) == "non-indexable"
