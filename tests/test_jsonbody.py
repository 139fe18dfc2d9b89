"""Bounded JSON parsing: the depth scan and the parse that never raises anything but JsonError."""

from __future__ import annotations

import json

import pytest

from prerender_ray.jsonbody import MAX_DEPTH, JsonError, json_depth, parse_json, unknown_keys


@pytest.mark.parametrize("text, depth", [
    (b"1", 0), (b"", 0), (b'"[[["', 0), (b"[]", 1), (b"{}", 1), (b'{"a": [1, {"b": 2}]}', 3),
    (b'["]", "[", "\\"[", "\\\\"]', 1),  # brackets in strings, escaped quotes, an escaped backslash
    (b'[{"k": "v"}, [[]]]', 3),
])
def test_the_depth_counts_brackets_outside_strings(text: bytes, depth: int) -> None:
    assert json_depth(text) == depth
    if text:
        assert json.loads(text) is not None  # the cases are JSON


@pytest.mark.parametrize("size", [10 * 1024, 1024 * 1024])
def test_deeply_nested_arrays_are_a_json_error_not_a_recursion_error(size: int) -> None:
    deep = b"[" * size + b"]" * size
    with pytest.raises(RecursionError):
        json.loads(deep)  # what the parser alone does
    with pytest.raises(JsonError, match=f"nested deeper than {MAX_DEPTH}"):
        parse_json(deep)
    assert json_depth(deep, stop_above=MAX_DEPTH) > MAX_DEPTH
    assert json_depth(deep) == size


def test_the_limit_itself_is_accepted_and_one_more_is_refused() -> None:
    assert parse_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(JsonError):
        parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert parse_json('{"a": "é"}'.encode()) == {"a": "é"}
    assert parse_json('{"a": 1}') == {"a": 1}  # str too


@pytest.mark.parametrize("bad", [b"\xff\xfe{", b'{"a": "\xc3"}', b"{", b"[1,]", b"1" * 5000, b"nul"])
def test_invalid_utf8_garbage_and_huge_integers_are_json_errors(bad: bytes) -> None:
    with pytest.raises(JsonError, match="not valid JSON"):
        parse_json(bad, what="metadata")


def test_unknown_keys_are_listed_sorted() -> None:
    assert unknown_keys({"url": 1, "sitemap": 2, "b": 3}, {"url"}) == ["b", "sitemap"]
    assert unknown_keys({"url": 1}, ("url", "revalidate")) == []
    assert unknown_keys({}, ()) == []
