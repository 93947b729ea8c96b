"""The shared validators (issue 35: one rule once, each interface's words around it)."""
from __future__ import annotations

import math

import pytest

from elasticslice import config, validate
from elasticslice.errors import ConfigError
from elasticslice.managers import config as mconfig


def err(key: str, message: str) -> ConfigError:
    return ConfigError(f"{key}: {message}")


def test_counts_and_seconds_refuse_bools_and_what_is_not_finite() -> None:
    assert validate.is_count(3, 1) and validate.is_count(0, 0)
    assert not any(validate.is_count(v, 1) for v in (0, True, 2.0, "2", None))
    assert validate.is_seconds(0) and validate.is_seconds(1.5, positive=True)
    assert not any(validate.is_seconds(v) for v in (-1, math.inf, math.nan, False, "1"))
    assert not validate.is_seconds(0, positive=True)
    assert validate.is_command("python3") and not validate.is_command("a\nb")
    assert not validate.is_command("") and not validate.is_command(None)


def test_config_text_keeps_its_messages() -> None:
    assert validate.port_number("0") == 0
    with pytest.raises(ValueError, match="must be 0 to 65535: '70000'"):
        validate.port_number("70000")
    assert validate.check_address("localhost") == "127.0.0.1"
    with pytest.raises(ValueError, match="not an IP address: 'nowhere'"):
        validate.check_address("nowhere")
    with pytest.raises(ValueError, match="no address nodes can reach"):
        validate.check_address("0.0.0.0")
    assert validate.ip_literal("0.0.0.0").is_unspecified  # the endpoint may listen on all
    with pytest.raises(ConfigError, match="verify: not a boolean: 'maybe'"):
        validate.boolean("maybe", err)
    with pytest.raises(ConfigError, match="k: must be at least 1: '0'"):
        validate.number({"k": "0"}, "k", 5, err, minimum=1, integer=True)
    with pytest.raises(ConfigError, match="url: not an https URL"):
        validate.https_url("http://x/", err, "url")


def test_both_config_modules_use_the_one_module() -> None:
    for name in ("bounded_int", "port_number", "check_address"):
        assert getattr(config, name) is getattr(validate, name)
    assert mconfig.number is validate.number and mconfig.boolean is validate.boolean
