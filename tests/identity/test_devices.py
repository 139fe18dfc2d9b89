"""Device types: sanitizing, the forwarded path prefix, and the origin user agents."""

from __future__ import annotations

import pytest

from prerender_ray.config.loading import parse
from prerender_ray.identity.devices import Devices, sanitize_device, split_device_prefix

SUPPORTED = ("desktop", "mobile", "tablet")


def test_a_device_is_lower_cased_before_the_membership_test() -> None:
    assert sanitize_device("TABLET", SUPPORTED) == "tablet"
    assert sanitize_device("Mobile", SUPPORTED) == "mobile"


def test_an_unknown_or_missing_device_falls_back_to_the_first_supported() -> None:
    assert sanitize_device("watch", SUPPORTED) == "desktop"
    assert sanitize_device(None, SUPPORTED) == "desktop"
    assert sanitize_device("", SUPPORTED) == "desktop"


def test_a_padded_device_is_not_trimmed_and_falls_back() -> None:
    assert sanitize_device("mobile ", SUPPORTED) == "desktop"


def test_a_custom_supported_list_falls_back_to_its_own_first_entry() -> None:
    assert sanitize_device("watch", ("tv", "desktop")) == "tv"


def test_the_device_prefix_is_taken_from_the_first_path_segment() -> None:
    assert split_device_prefix("/mobile/product/prd-1", SUPPORTED) == ("mobile", "/product/prd-1")
    assert split_device_prefix("/DESKTOP/a?b", SUPPORTED) == ("desktop", "/a?b")


def test_a_device_only_path_becomes_the_root() -> None:
    assert split_device_prefix("/tablet", SUPPORTED) == ("tablet", "/")
    assert split_device_prefix("/tablet/", SUPPORTED) == ("tablet", "/")


def test_a_path_without_a_device_prefix_has_no_device() -> None:
    assert split_device_prefix("/render_queue", SUPPORTED) == (None, "/render_queue")
    assert split_device_prefix("/mobiles/a", SUPPORTED) == (None, "/mobiles/a")
    assert split_device_prefix("//mobile/x", SUPPORTED) == (None, "//mobile/x")
    assert split_device_prefix("/", SUPPORTED) == (None, "/")
    assert split_device_prefix("", SUPPORTED) == (None, "")


def test_devices_from_the_config_sanitize_and_name_the_origin_user_agent() -> None:
    cfg = parse({"deviceTypes": {"supported": ["Desktop", "mobile", "tv"], "default": ["desktop"]},
                 "origin": {"userAgents": {"tv": "SmartTV/1.0"}}}).config
    devices = Devices.from_config(cfg)
    assert devices.supported == ("desktop", "mobile", "tv")
    assert devices.default == ("desktop",)
    assert devices.fallback == "desktop"
    assert devices.sanitize("TV") == "tv"
    assert devices.from_path("/tv/a") == ("tv", "/a")
    assert devices.user_agent("tv") == "SmartTV/1.0"
    assert "HarperProxy/1.0" in devices.user_agent("mobile")
    assert devices.user_agent("unknown") == devices.user_agent("desktop")


def test_the_default_user_agents_keep_the_reference_strings() -> None:
    devices = Devices.from_config(parse({}).config)
    assert "Pixel 5" in devices.user_agent("mobile")
    assert "Chrome/W.X.Y.Z" in devices.user_agent("desktop")  # W.X.Y.Z is literal
    assert "Pixel C" in devices.user_agent("tablet")


def test_an_empty_supported_list_is_refused() -> None:
    with pytest.raises(ValueError):
        Devices(())
