"""Device types: which one a bot request is for, and the user agent the origin is fetched with.

A device is one of ``device_types.supported`` (lower-case). Anything else, missing or padded
(``"mobile "`` is not trimmed) falls back to the first supported device, as in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prerender_ray.config.model import Config


def sanitize_device(value: str | None, supported: Sequence[str]) -> str:
    """Lower-case, then exact membership in ``supported``; otherwise ``supported[0]``."""
    if value:
        lowered = value.lower()
        if lowered in supported:
            return lowered
    return supported[0]


def split_device_prefix(path: str, supported: Sequence[str]) -> tuple[str | None, str]:
    """Forwarded path mode: ``/mobile/a`` -> ``("mobile", "/a")``; ``/tablet`` and ``/tablet/`` -> ``"/"``.

    The first segment is compared lower-cased. Without a supported first segment (``//x`` has an
    empty one) the device is None and the path is returned unchanged.
    """
    end = path.find("/", 1)
    segment = path[1:] if end < 0 else path[1:end]
    device = segment.lower()
    if not path.startswith("/") or device not in supported:
        return None, path
    rest = "" if end < 0 else path[end:]
    return device, rest or "/"


class Devices:
    """The device-type options of one config."""

    def __init__(
        self, supported: Sequence[str], default: Sequence[str] = (), user_agents: dict[str, str] | None = None
    ):
        if not supported:
            raise ValueError("at least one device type must be supported")
        self.supported = tuple(d.lower() for d in supported)
        self.default = tuple(default)  # scheduled at discovery
        self._user_agents = dict(user_agents or {})

    @classmethod
    def from_config(cls, cfg: Config) -> Devices:
        agents = cfg.origin.user_agents
        supported = cfg.device_types.supported
        return cls(supported, cfg.device_types.default, {d: agents.for_device(d) for d in supported})

    @property
    def fallback(self) -> str:
        return self.supported[0]

    def sanitize(self, value: str | None) -> str:
        return sanitize_device(value, self.supported)

    def from_path(self, path: str) -> tuple[str | None, str]:
        return split_device_prefix(path, self.supported)

    def user_agent(self, device: str) -> str:
        """The User-Agent the origin is fetched with for ``device`` (the fallback device's otherwise)."""
        return self._user_agents.get(device) or self._user_agents.get(self.supported[0], "")
