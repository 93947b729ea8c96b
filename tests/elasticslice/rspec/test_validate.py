"""Validation against the packaged schemas: verdicts, line numbers, the schema files."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.rspec import RSpecType, SchemaProblem, validate
from elasticslice.rspec.validate import schema_dir, schema_for

V3 = "http://www.geni.net/resources/rspec/3"
REPO = Path(__file__).resolve().parents[3]


def test_schemas_are_package_data() -> None:
    root = schema_dir()
    assert root.parent.name == "rspec" and root.parent.parent.name == "elasticslice"
    for rel in ("3/request.xsd", "3/manifest.xsd", "3/ad.xsd", "ext/emulab/1/vtop_extension.xsd",
                "ext/emulab/1/ptop_extension.xsd", "ext/user/1/manifest.xsd"):
        assert (root / rel).is_file(), rel
    for rtype in RSpecType:
        assert schema_for(rtype) is schema_for(rtype)  # compiled once


def test_invalid_request_reports_each_problem_with_its_line() -> None:
    xml = (f'<rspec xmlns="{V3}" type="request">\n'
           '  <node client_id="ok"/>\n'
           '  <node/>\n'
           '  <node client_id="b" exclusive="maybe"/>\n'
           '</rspec>\n')
    problems = validate(xml)
    assert [p.line for p in problems] == [3, 4]
    assert "client_id" in problems[0].message and "exclusive" in problems[1].message
    assert str(problems[0]).startswith("line 3: ")


def test_type_decides_the_schema() -> None:
    manifest_only = (f'<rspec xmlns="{V3}" type="request">\n'
                     '<node client_id="a"><host name="a.example.org"/></node></rspec>')
    assert validate(manifest_only)  # host is not part of a request
    assert validate(manifest_only.replace('"request"', '"manifest"')) == []


def test_emulab_extension_elements_are_checked() -> None:
    xml = (f'<rspec xmlns="{V3}" xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1" '
           'type="request"><node client_id="a"><emulab:vnode/></node></rspec>')
    (problem,) = validate(xml)
    assert "vnode" in problem.message and "name" in problem.message


@pytest.mark.parametrize("xml,fragment", [
    ('<rspec xmlns="http://www.protogeni.net/resources/rspec/2" type="manifest"/>',
     "not a GENI v3 RSpec"),
    (f'<rspec xmlns="{V3}" type="tuesday"/>', "unknown rspec type 'tuesday'"),
    ("<html/>", "not a GENI v3 RSpec"),
])
def test_not_a_v3_rspec_is_one_problem(xml: str, fragment: str) -> None:
    (problem,) = validate(xml)
    assert isinstance(problem, SchemaProblem) and fragment in problem.message


def test_shipped_example_rspecs_validate() -> None:
    files = sorted((REPO / "rspecs").glob("*.xml"))
    assert len(files) >= 2
    for path in files:
        assert validate(path.read_bytes(), source=str(path), strict=True) == [], path


def test_concurrent_validations_keep_their_own_verdicts() -> None:
    from concurrent.futures import ThreadPoolExecutor

    good = f'<rspec xmlns="{V3}" type="request"><node client_id="a"/></rspec>'
    bad = f'<rspec xmlns="{V3}" type="request">\n<node/></rspec>'
    docs = [good, bad] * 40
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(validate, docs))
    for doc, problems in zip(docs, results):
        assert (problems == []) == (doc is good)
        if doc is bad:
            assert [p.line for p in problems] == [2]
