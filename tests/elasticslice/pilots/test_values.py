"""Our resource values for CloudLab's CLIENT policy: the order a reclamation takes nodes."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.errors import ConfigError
from elasticslice.managers.config import EndpointConfig, load_manager_config
from elasticslice.pilots.values import NodeWork, changed, node_values, reclaim_order


def test_idle_pilots_go_first_then_booting_then_busy_by_the_work_they_would_lose() -> None:
    values = node_values({
        "busy-long": NodeWork(ready=True, units=2, core_seconds=7200.0, at_risk=2),
        "busy-short": NodeWork(ready=True, units=1, core_seconds=60.0, at_risk=1),
        "safe": NodeWork(ready=True, units=3, at_risk=0),   # all ends within the countdown
        "booting": NodeWork(ready=False),
        "idle-new": NodeWork(ready=True, idle_for=5.0),
        "idle-old": NodeWork(ready=True, idle_for=600.0),
    })
    assert reclaim_order(values) == ["idle-old", "idle-new", "booting", "safe", "busy-short",
                                     "busy-long"]
    assert all(0.0 <= v <= 1.0 for v in values.values())
    assert max(values["idle-new"], values["booting"], values["safe"]) < 0.5 <= \
        values["busy-short"]   # Troy's low_value: no long unit goes to a node that may go


def test_values_are_sent_again_only_when_the_order_or_a_value_moves() -> None:
    old = {"a": 0.1, "b": 0.6}
    assert not changed(old, {"a": 0.1, "b": 0.61})
    assert changed(old, {"a": 0.1, "b": 0.7})
    assert changed(old, {"a": 0.7, "b": 0.6})      # another order
    assert changed(old, {"a": 0.1})                # another set of nodes


def test_the_reclaim_policy_is_client_unless_the_config_says_lifo(tmp_path: Path) -> None:
    def endpoint(lines: str) -> EndpointConfig:
        path = tmp_path / "elasticslice.conf"
        path.write_text("[protogeni]\ncm_urls = https://cm.example/cm\n[endpoint]\n" + lines)
        return load_manager_config(path, env={}).endpoint

    assert endpoint("").policy == "CLIENT"
    assert endpoint("policy = lifo\n").policy == "LIFO"
    with pytest.raises(ConfigError, match="policy"):
        endpoint("policy = fifo\n")
