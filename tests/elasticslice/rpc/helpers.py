"""Helpers for the client tests: times, geni-lib requests, the client CLI in process."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from click.testing import CliRunner

from elasticslice.cli import cli


def hours(h: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=h)


def genilib_request(*names: str, hardware_type: str | None = None) -> str:
    """A request RSpec written with geni-lib, as CloudLab profiles are."""
    import geni.rspec.pg as pg
    request = pg.Request()
    for name in names:
        node = pg.RawPC(name)
        if hardware_type:
            node.hardware_type = hardware_type
        request.addResource(node)
    return request.toXMLString(pretty_print=True).decode("utf-8")


def run_cli(emu: Any, *args: str, ok: bool = True) -> Any:
    """``elasticslice --config EMU ARGS`` through click's runner (exit 0 unless not ``ok``)."""
    result = CliRunner().invoke(cli, ["--config", str(emu.config_path), *args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def sliver_status(emu: Any) -> dict[str, Any]:
    return json.loads(run_cli(emu, "sliver-status", "--json").output)
