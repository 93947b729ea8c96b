"""A slow or busy CM on demand (`emulator serve --slow/--busy`): the settings, their checks,
and what a call meets."""
from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator.pressure import Pressure, parse_items
from elasticslice.errors import ConfigError
from tests.helpers import wait_for


def test_items_parse_and_bad_ones_are_one_line_naming_the_option() -> None:
    assert parse_items(["AddNodes=30", "cm.RenewSlice=0.5"], "--slow") == {
        "AddNodes": 30.0, "cm.RenewSlice": 0.5}
    for bad in ("AddNodes", "=3", "AddNodes=x", "AddNodes=nan"):
        with pytest.raises(ConfigError, match=r"--slow .*METHOD=NUMBER") as err:
            parse_items([bad], "--slow")
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("slow, busy, message", [
    ({"AddNode": 1}, None, "--slow AddNode: not a method"),
    ({"AddNodes": -1}, None, "--slow AddNodes=-1: expected a number from 0 to 3600"),
    (None, {"AddNodes": 1.5}, "--busy AddNodes=1.5: expected a number from 0 to 1"),
    (None, {"admin.Revoke": 1}, "--busy admin.Revoke: not a method"),
])
def test_unknown_methods_and_out_of_range_values_are_refused(slow, busy, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Pressure(slow, busy)


def test_busy_answers_at_once_and_only_for_its_method_and_module() -> None:
    pressure = Pressure(busy={"AddNodes": 1.0, "sa.GetVersion": 1.0}, seed=1)
    assert pressure.apply("cm", "AddNodes") is True
    assert pressure.apply("cm", "DeleteNodes") is False
    assert pressure.apply("sa", "GetVersion") is True
    assert pressure.apply("cm", "GetVersion") is False  # qualified: the SA's only
    assert pressure.busy_answers("AddNodes") == 1
    half = Pressure(busy={"AddNodes": 0.5}, seed=7)
    again = Pressure(busy={"AddNodes": 0.5}, seed=7)
    answers = [half.apply("cm", "AddNodes") for _ in range(40)]
    assert answers == [again.apply("cm", "AddNodes") for _ in range(40)]  # seeded
    assert 0 < sum(answers) < 40


def test_a_slow_call_is_in_flight_until_it_has_waited_or_is_relieved() -> None:
    pressure = Pressure(slow={"AddNodes": 3600})
    done: list[bool] = []
    caller = threading.Thread(target=lambda: done.append(pressure.apply("cm", "AddNodes")))
    caller.start()
    wait_for(lambda: pressure.in_flight("AddNodes") == 1, what="the call waiting")
    assert pressure.describe()["in_flight"] == {"AddNodes": 1}
    pressure.relieve()  # the hour is cut short; the call goes on, not BUSY
    caller.join(timeout=30)
    assert done == [False] and pressure.in_flight("AddNodes") == 0
    assert pressure.apply("cm", "AddNodes") is False  # relieved: no more pressure
    pressure.set(busy={"AddNodes": 1.0})
    assert pressure.apply("cm", "AddNodes") is True


def test_serve_refuses_bad_pressure_with_one_line(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["emulator", "serve", "--dir", str(tmp_path), "--slow",
                                      "AddNodes=30", "--busy", "Nope=0.5"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: --busy Nope: not a method of the emulator's SA, CM or dynslice server "
        "(e.g. AddNodes, cm.RenewSlice, wisc/AddNodes)"]


def test_a_cluster_named_in_a_setting_is_a_name_and_its_method_a_method() -> None:
    pressure = Pressure(busy={"wisc/AddNodes": 1.0})
    assert pressure.clusters() == {"wisc"}
    assert pressure.apply("cm", "AddNodes", "wisc") is True
    assert pressure.apply("cm", "AddNodes", "utah") is False
    assert pressure.apply("cm", "AddNodes") is False
    for bad in ("Wisc/AddNodes", "wisc/Nope", "/AddNodes"):
        with pytest.raises(ConfigError, match="not a method"):
            Pressure(slow={bad: 1.0})
