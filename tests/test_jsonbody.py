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


@pytest.mark.parametrize("bad, error", [
    (b"\xff\xfe{", "not UTF-8"), (b'{"a": "\xc3"}', "not UTF-8"), (b'{"a": "\0"}', "not UTF-8"),
    (b"{", "not valid JSON"), (b"[1,]", "not valid JSON"), (b"1" * 5000, "not valid JSON"), (b"nul", "not valid JSON"),
])
def test_invalid_utf8_garbage_and_huge_integers_are_json_errors(bad: bytes, error: str) -> None:
    with pytest.raises(JsonError, match=f"metadata is {error}"):
        parse_json(bad, what="metadata")


HIDDEN = '["\u2200", ' + "[" * 500 + "]" * 500 + ', "\u2200"]'


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32"])
def test_json_that_is_not_utf8_is_refused_before_its_depth_could_hide(codec: str) -> None:
    """json.loads(bytes) detects UTF-16/32 too, where "\u2200" holds a '"' byte: the scan saw one string
    across the brackets (depth 1) and the parser read them all (depth 500)."""
    data = HIDDEN.encode(codec)
    assert json_depth(data) == 1 and json.loads(data) == json.loads(HIDDEN)  # what the two saw
    with pytest.raises(JsonError, match="metadata is not UTF-8"):
        parse_json(data, what="metadata")


def test_a_utf8_byte_order_mark_is_ignored_as_json_loads_ignores_it() -> None:
    assert json.loads(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    assert parse_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1} == parse_json('\ufeff{"a": 1}')
    deep = b"\xef\xbb\xbf" + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(JsonError, match="nested deeper"):
        parse_json(deep)
    with pytest.raises(JsonError, match="not valid JSON"):
        parse_json(b"\xef\xbb\xbf\xef\xbb\xbf[]")  # one mark, not two


def test_unknown_keys_are_listed_sorted() -> None:
    assert unknown_keys({"url": 1, "sitemap": 2, "b": 3}, {"url"}) == ["b", "sitemap"]
    assert unknown_keys({"url": 1}, ("url", "revalidate")) == []
    assert unknown_keys({}, ()) == []


@pytest.mark.parametrize("bad", [b'{"reason": "x\\ud800"}', b'{"a": ["\\uDFFF"]}', b'{"\\udc00": 1}',
                                 b'["\\ude00\\ud83d"]'])  # a pair the wrong way round is two lone ones
def test_a_lone_surrogate_escape_is_a_json_error(bad: bytes) -> None:
    json.loads(bad)  # what the parser alone accepts
    with pytest.raises(JsonError, match="lone surrogate"):
        parse_json(bad, what="metadata")


def test_a_valid_surrogate_pair_and_an_escaped_backslash_before_u_are_text() -> None:
    assert parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}
    assert parse_json(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # a backslash, then text
