"""Cache keys: the canonical URL and the device type joined by the configured delimiter.

Pages and schedule rows are keyed per device (``https://x.com/a|mobile``); targets by the url half
alone. Changing any ``cache_key`` option (delimiter, attributes, query params, decode_reserved,
trailing_slash, plus_is_space) re-keys everything: old pages and schedules become orphans.

Better than the reference: parsing takes the attributes around the url from the two ends of the key,
so a custom delimiter that also occurs inside the URL (``::`` in ``https://[::1]/``) still splits
right. With the default ``|``, which canonical URLs never contain, this is the reference's "text
before the first delimiter".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from prerender_ray.identity.urls import DECODE_RESERVED_ALLOWED, TRAILING_SLASH_MODES, canonicalize_url

if TYPE_CHECKING:
    from prerender_ray.config.model import Config
    from prerender_ray.config.service import CacheKey

URL = "url"
DEVICE = "deviceType"
DEFAULT_DELIMITER = "|"
DEFAULT_ATTRIBUTES = (URL, DEVICE)


class CacheKeyError(ValueError):
    """A key that does not have the configured shape (wrong number of delimiters)."""


def cache_key(
    url: str, device: str | None, *, delimiter: str = DEFAULT_DELIMITER,
    attributes: Sequence[str] = DEFAULT_ATTRIBUTES,
) -> str:
    """``<url>|<device>`` in the configured attribute order. A missing value is an empty string (so a
    missing device leaves a trailing delimiter), as is any attribute other than url and deviceType."""
    values = {URL: url, DEVICE: device}
    return delimiter.join(values.get(name) or "" for name in attributes)


def parse_cache_key(
    key: str, *, delimiter: str = DEFAULT_DELIMITER, attributes: Sequence[str] = DEFAULT_ATTRIBUTES
) -> dict[str, str]:
    """The inverse of ``cache_key``: ``{"url": ..., "deviceType": ...}``. Raises ``CacheKeyError``."""
    attributes = tuple(attributes)
    if URL not in attributes:
        pieces = key.split(delimiter)
        if len(pieces) != len(attributes):
            raise CacheKeyError(_shape_message(key, delimiter, attributes))
        return dict(zip(attributes, pieces, strict=True))
    at = attributes.index(URL)
    after = len(attributes) - at - 1
    head = key.split(delimiter, at) if at else [key]
    tail = head[-1].rsplit(delimiter, after) if after else [head[-1]]
    if len(head) != at + 1 or len(tail) != after + 1:
        raise CacheKeyError(_shape_message(key, delimiter, attributes))
    return dict(zip(attributes, head[:-1] + tail, strict=True))


def extract_url(
    key: str, delimiter: str = DEFAULT_DELIMITER, attributes: Sequence[str] = DEFAULT_ATTRIBUTES
) -> str:
    """The url half of a key (the Target key). Raises ``CacheKeyError``."""
    if tuple(attributes) == DEFAULT_ATTRIBUTES:
        url, sep, _ = key.rpartition(delimiter)
        if not sep:
            raise CacheKeyError(_shape_message(key, delimiter, attributes))
        return url
    return parse_cache_key(key, delimiter=delimiter, attributes=attributes)[URL]


def _shape_message(key: str, delimiter: str, attributes: Sequence[str]) -> str:
    shown = key if len(key) <= 200 else key[:197] + "..."
    return f"cache key {shown!r} does not have the shape {delimiter.join(attributes)!r}"


@dataclass(frozen=True)
class KeyFormat:
    """The ``cache_key`` options in one place: canonicalize a URL and build or parse its keys."""

    delimiter: str = DEFAULT_DELIMITER
    attributes: tuple[str, ...] = DEFAULT_ATTRIBUTES
    query_params: tuple[str, ...] = ("page",)
    decode_reserved: tuple[str, ...] = (":", ",", "@")
    trailing_slash: str = "strip"
    plus_is_space: bool = False

    def __post_init__(self) -> None:
        if not self.delimiter:
            raise ValueError("cache key delimiter must not be empty")
        if URL not in self.attributes or len(set(self.attributes)) != len(self.attributes):
            raise ValueError(f"cache key attributes {list(self.attributes)} must name url once, no repeats")
        if self.trailing_slash not in TRAILING_SLASH_MODES:
            raise ValueError(f"trailing_slash must be strip or preserve, not {self.trailing_slash!r}")
        bad = [c for c in self.decode_reserved if c not in DECODE_RESERVED_ALLOWED]
        if bad:
            raise ValueError(f"decode_reserved entries {bad} not allowed")

    @classmethod
    def from_config(cls, cfg: Config | CacheKey) -> KeyFormat:
        ck = cast("CacheKey", getattr(cfg, "cache_key", cfg))
        return cls(
            delimiter=ck.delimiter,
            attributes=tuple(ck.attributes),
            query_params=tuple(ck.query_params),
            decode_reserved=tuple(ck.decode_reserved),
            trailing_slash=ck.trailing_slash,
            plus_is_space=ck.plus_is_space,
        )

    def check_devices(self, devices: Iterable[str]) -> None:
        """A device name holding the delimiter would make keys ambiguous; refuse such a config."""
        clashing = [d for d in devices if self.delimiter in d]
        if clashing:
            raise ValueError(f"device types {clashing} contain the cache key delimiter {self.delimiter!r}")

    def canonicalize(self, url: str | tuple[str, str, str, str], allowlist: Iterable[str] | None = None) -> str:
        """``canonicalize_url`` with these options; the global ``query_params`` unless told otherwise."""
        return canonicalize_url(
            url,
            self.query_params if allowlist is None else allowlist,
            plus_is_space=self.plus_is_space,
            trailing_slash=self.trailing_slash,
            decode_reserved=self.decode_reserved,
        )

    @property
    def appends(self) -> bool:
        """Whether a key is its URL with a per-device suffix appended (the default shape)."""
        return self.attributes == DEFAULT_ATTRIBUTES

    @property
    def variant_delimiter(self) -> str | None:
        """What ends the prefix a URL's device variants share (``<url><delimiter>``, the URL ending at
        the last delimiter): a bulk walk asks for a URL's route once. None when the layout gives the
        variants no common prefix."""
        return self.delimiter if self.appends else None

    def suffixes(self, devices: Sequence[str]) -> tuple[str, ...]:
        """What ``key`` appends to a URL for each device when ``appends``: a bulk put builds each
        key with one concatenation."""
        return tuple(map(self._suffix, devices))

    def _suffix(self, device: str) -> str:
        return f"{self.delimiter}{device or ''}"

    def key(self, url: str, device: str) -> str:
        if self.appends:
            return url + self._suffix(device)
        return cache_key(url, device, delimiter=self.delimiter, attributes=self.attributes)

    def parse(self, key: str) -> dict[str, str]:
        return parse_cache_key(key, delimiter=self.delimiter, attributes=self.attributes)

    def url_of(self, key: str) -> str:
        return extract_url(key, self.delimiter, self.attributes)
