"""One set of rules on every path: well-formedness (tree and event parsers alike) and the
node client_id rule of AddNodes (rspec validate, the client, the CM)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.errors import RSpecError
from elasticslice.rspec import (
    BadAddNodesArgs, client_id_problem, nodespecs_from_add_args, parse, request_problem, validate,
)

V3 = "http://www.geni.net/resources/rspec/3"


def request(*client_ids: str, extra: str = "", node_attrs: str = "") -> str:
    nodes = "".join(f'\n  <node client_id="{c}" {node_attrs}><sliver_type name="raw-pc"/></node>'
                    for c in client_ids)
    return f'<rspec xmlns="{V3}" {extra} type="request">{nodes}\n</rspec>\n'


DUP_NS = request("n1", extra='xmlns:a="urn:x" xmlns:b="urn:x"', node_attrs='a:foo="1" b:foo="2"')
UNDECLARED = request("n1", node_attrs='zz:foo="1"')


@pytest.mark.parametrize("text, message", [
    (DUP_NS, "Namespaced Attribute foo in 'urn:x' redefined"),
    (UNDECLARED, "Namespace prefix zz for foo on node is not defined"),
])
def test_every_parse_path_refuses_what_validate_calls_not_well_formed(tmp_path, text, message):
    """Broke: validate said not well-formed; show and CreateSliver (parse) accepted it."""
    for check in (parse, validate):
        with pytest.raises(RSpecError) as info:
            check(text, "r.xml")
        assert str(info.value) == f"r.xml:2: not well-formed XML: {message}"
    f = tmp_path / "r.xml"
    f.write_text(text)
    for command in ("show", "validate"):
        result = CliRunner().invoke(cli, ["rspec", command, str(f)])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1].endswith(
            f"{f}:2: not well-formed XML: {message}")


@pytest.mark.parametrize("cid", ["../../x", "a/b", ".hidden", "x" * 65, "a b", "é"])
def test_one_client_id_rule_for_add_nodes_requests_and_validate(tmp_path, cid):
    """Broke: CreateSliver and validate accepted client_id="../../x", which AddNodes refuses."""
    problem = client_id_problem(cid)
    assert problem and "client_id must be 1-64 letters, digits, '-', '_' or '.'" in problem
    with pytest.raises(BadAddNodesArgs, match="client_id must be 1-64"):
        nodespecs_from_add_args({cid: {}})
    rspec = parse(request("ok", cid))
    assert request_problem(rspec) == problem
    with pytest.raises(RSpecError, match="client_id must be 1-64"):
        rspec.check_request()
    f = tmp_path / "r.xml"
    f.write_text(request("ok", cid))
    result = CliRunner().invoke(cli, ["rspec", "validate", str(f)])
    assert result.exit_code == 1
    assert f"{f}:3: node client_id" in result.stderr and "client_id must be" in result.stderr


def test_repeated_client_id_is_a_problem_everywhere():
    text = request("a", "b", "a")
    assert [str(p) for p in validate(text)] == ["line 4: node client_id 'a' given twice"]
    assert request_problem(parse(text)) == "node client_id 'a' given twice"
    assert request_problem(parse(request("a", "b", "c_1.x-2"))) is None


def test_manifests_and_ads_are_not_held_to_the_request_rule():
    manifest = request("../odd").replace('type="request"', 'type="manifest"')
    assert request_problem(parse(manifest)) is None


def test_validate_caps_the_problems_it_prints(tmp_path):
    """Broke: 100,000 bad attributes printed 100,000 lines."""
    attrs = " ".join(f'bad{i}="x"' for i in range(100_000))
    f = tmp_path / "many.xml"
    f.write_text(request("a", node_attrs=attrs))
    result = CliRunner().invoke(cli, ["rspec", "validate", str(f)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 21 and all(line.startswith(f"{f}:2: ") for line in lines[:20])
    assert lines[-1] == (f"{f}: ... and 99980 more problem(s) (100000 in all; "
                         f"--max-problems 0 prints every one)")
    few = tmp_path / "few.xml"
    few.write_text(request("a", node_attrs=" ".join(f'bad{i}="x"' for i in range(30))))
    every = CliRunner().invoke(cli, ["rspec", "validate", "--max-problems", "0", str(few)])
    assert every.exit_code == 1 and len(every.stderr.strip().splitlines()) == 30
    three = CliRunner().invoke(cli, ["rspec", "validate", "--max-problems", "3", str(few)])
    assert three.stderr.strip().splitlines()[-1].startswith(f"{few}: ... and 27 more")
