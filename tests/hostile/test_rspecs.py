"""Hostile RSpecs through every edge that reads one: `elasticslice rspec validate`, the
client's `create-sliver` (refused locally, before any call), and the emulator's CreateSliver
and AddNodes (BADARGS). Each gets one line naming what is wrong; the emulator keeps serving
and the managed slice of the package is untouched."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.rspec import DEFAULT_MAX_BYTES
from tests.elasticslice.emulator.helpers import REQUEST, Session
from tests.hostile.helpers import CORPUS, ManagedSlice, corpus, one_line_error

RSPECS = corpus("rspecs")
IDS = [p.name for p, _ in RSPECS]
ADDNODES = json.loads((CORPUS / "addnodes" / "cases.json").read_text())


def fragment(expected: str | dict[str, str | None], edge: str) -> str | None:
    if isinstance(expected, str):
        return expected
    return expected.get(edge, expected.get("*"))


def _xml_text(data: bytes) -> str:
    """What an XML-RPC string can carry of ``data`` (no control characters)."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "",
                  data.decode("utf-8", "replace"))


@pytest.mark.parametrize("path, expected", RSPECS, ids=IDS)
def test_rspec_validate_refuses_in_one_line(path: Path, expected: Any) -> None:
    result = CliRunner().invoke(cli, ["rspec", "validate", str(path)])
    want = fragment(expected, "validate")
    if want is None:  # valid as what it is (a manifest); the other edges refuse it
        assert result.exit_code == 0, result.output
        return
    line = one_line_error(result.output)
    assert result.exit_code != 0 and str(path) in line and want in line, line


@pytest.mark.parametrize("path, expected", RSPECS, ids=IDS)
def test_create_sliver_refuses_locally_in_one_line(managed: ManagedSlice, path: Path,
                                                   expected: Any) -> None:
    # the config's slice is the managed one: a request that got through would reach its CM
    result = CliRunner().invoke(cli, ["--config", str(managed.emulator.config_path),
                                      "create-sliver", str(path)])
    line = one_line_error(result.output)
    assert result.exit_code == 1 and str(path) in line, line
    assert fragment(expected, "create-sliver") in line, line
    managed.assert_intact()


@pytest.fixture(scope="module")
def session(managed: ManagedSlice) -> Session:
    return Session(managed.emulator)


@pytest.mark.parametrize("path, expected", RSPECS, ids=IDS)
def test_emulator_create_sliver_answers_badargs(managed: ManagedSlice, session: Session,
                                                path: Path, expected: Any) -> None:
    urn, cred = session.register("h" + re.sub(r"[^a-z0-9]", "", path.stem)[:17])
    answer = session.cm.CreateSliver({"slice_urn": urn, "rspec": _xml_text(path.read_bytes()),
                                      "credentials": [cred]})
    assert answer["code"] == 1, answer
    assert fragment(expected, "cm") in answer["output"] and "\n" not in answer["output"]
    assert session.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"] == 12
    managed.assert_intact()


def test_huge_rspec_is_refused_before_parsing(managed: ManagedSlice, session: Session,
                                              tmp_path: Path) -> None:
    huge = tmp_path / "huge.xml"
    node = '<node client_id="n"/>'
    with huge.open("w") as f:
        f.write('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">')
        f.write(node * (DEFAULT_MAX_BYTES // len(node) + 1) + "</rspec>")
    for command in (["rspec", "validate", str(huge)],
                    ["--config", str(managed.emulator.config_path), "create-sliver", str(huge)]):
        result = CliRunner().invoke(cli, command)
        assert "larger than the limit" in one_line_error(result.output), result.output
        assert result.exit_code != 0
    managed.assert_intact()


_SLIVERS = itertools.count()


@pytest.fixture(scope="module")
def sliver(session: Session) -> tuple[str, str]:
    """A sliver of n1, n2 on the package's emulator. Its own slice each time the fixture is
    made: under xdist's worksteal a worker may come back to this module after another one
    (the module's fixtures are then made again) and the emulator still has the first."""
    urn, cred, _ = session.create(f"hostileadd{next(_SLIVERS)}", REQUEST)
    return urn, cred


def _client_ids(session: Session, urn: str, cred: str) -> list[str]:
    from elasticslice.rspec import parse
    manifest = session.cm.Resolve({"urn": urn, "credentials": [cred]})["value"]["manifest"]
    return sorted(n.client_id for n in parse(manifest).nodes)


@pytest.mark.parametrize("case", sorted(ADDNODES) + ["too_many"])
def test_emulator_add_nodes_answers_badargs_and_the_sliver_is_unchanged(
        managed: ManagedSlice, session: Session, sliver: tuple[str, str], case: str) -> None:
    urn, cred = sliver
    if case == "too_many":
        nodes, expected = {f"m{i}": {} for i in range(5000)}, "Not enough free nodes"
    else:
        nodes, expected = ADDNODES[case]["nodes"], ADDNODES[case]["expected"]
    answer = session.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": nodes})
    assert answer["code"] != 0 and expected in answer["output"], answer
    assert "\n" not in answer["output"] and len(answer["output"]) < 400
    assert _client_ids(session, urn, cred) == ["n1", "n2"]
    managed.assert_intact()
