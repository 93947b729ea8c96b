"""``[pilots]`` of the client config: what pilot nodes boot and run (the emulator's config
names its pilot image)."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.config import PilotSettings, load_pilot_settings
from elasticslice.errors import ConfigError


def test_pilot_settings_are_read_and_checked(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text("[pilots]\ndisk_image = urn:publicid:IDN+x+image+p//IMG\n"
                    "node_python = /opt/venv/bin/python\n[protogeni]\n")
    assert load_pilot_settings(conf) == PilotSettings("urn:publicid:IDN+x+image+p//IMG",
                                                      "/opt/venv/bin/python")
    conf.write_text("[protogeni]\n")
    assert load_pilot_settings(conf) == PilotSettings()
    conf.write_text("[pilots]\ndisk_image = URN\n")
    with pytest.raises(ConfigError, match="disk_image"):
        load_pilot_settings(conf)
    conf.write_text("[pilots]\npython = x\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_pilot_settings(conf)


def test_the_emulators_config_boots_the_stock_image_and_names_the_pilot_image_as_an_option(
        emulator_pki: Path, tmp_path: Path) -> None:
    """As on CloudLab: pilot nodes boot the stock image and build the agent's environment
    (no node_python); the pilot image is the quick option, in a comment a user can undo."""
    assert load_pilot_settings(emulator_pki / "elasticslice.conf") == PilotSettings()
    text = (emulator_pki / "elasticslice.conf").read_text()
    conf = tmp_path / "elasticslice.conf"
    enabled = text.replace("#   disk_image", "disk_image").replace("#   node_python",
                                                                      "node_python")
    conf.write_text(enabled)
    settings = load_pilot_settings(conf)
    assert settings.disk_image == \
        "urn:publicid:IDN+emulab.test+image+elasticslice//ELASTICSLICE-PILOT"
    assert settings.node_python == "python3"
