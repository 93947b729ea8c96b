"""`elasticslice run --cm CM` (repeatable): the CMs a run holds nodes at, in the order
given, over the config's [manager] cmlist; one that matches no configured CM (or several)
is one line naming it, exit 2, before anything is contacted or made. In-process: the
config's CMs are on 127.0.0.1 and nothing gets that far."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.commands.run import resolve_settings
from elasticslice.config import load_config
from tests.elasticslice.test_run_options import config, run

UTAH = "https://127.0.0.1:1/cluster/utah/protogeni/xmlrpc/cm"
WISC = "https://127.0.0.1:1/cluster/wisc/protogeni/xmlrpc/cm"
TWO = f"{UTAH}, {WISC}\ndynslice_urls = {UTAH[:-2]}dynslice, {WISC[:-2]}dynslice"


def test_cm_names_the_cms_in_order_and_wins_over_the_config(tmp_path: Path) -> None:
    path = config(tmp_path, "[manager]\ncmlist = utah\n", cm=TWO)
    client = load_config(path, env={})
    chosen = resolve_settings(client, {"cm": ["wisc", "0"]})
    assert chosen.cmlist == (WISC, UTAH) and chosen.sources["cmlist"] == "--cm"
    assert chosen.cluster_arguments()["manager_options"]["cmlist"] == [WISC, UTAH]
    # without --cm the config's cmlist goes on as before
    plain = resolve_settings(client, {})
    assert plain.cmlist == () and plain.cluster_arguments()["manager_options"]["cmlist"] == [
        UTAH]


@pytest.mark.parametrize("bad, matches", [("mars", 0), ("xmlrpc", 2), ("7", 0)])
def test_a_cm_the_config_does_not_have_is_one_line_and_exit_2(
        tmp_path: Path, bad: str, matches: int) -> None:
    path = config(tmp_path, cm=TWO)
    result = run(path, tmp_path, "--cm", "utah", "--cm", bad)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"Error: --cm {bad}: matches {matches} of the configured CMs ([protogeni] cm_urls: "
        f"{UTAH}, {WISC})"]
    assert not (tmp_path / "d").exists()   # nothing made


def test_run_help_says_what_cm_does() -> None:
    from click.testing import CliRunner

    from elasticslice.cli import cli
    text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    assert "--cm CM Hold nodes at this CM of [protogeni] cm_urls" in text
    assert "repeat for several" in text and "Config [manager] cmlist" in text
