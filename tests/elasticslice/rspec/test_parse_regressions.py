"""An RSpec without a type attribute used to be reported as `unknown rspec type None`."""
from __future__ import annotations

import pytest

from elasticslice.errors import RSpecError
from elasticslice.rspec import parse, validate

NO_TYPE = '<rspec xmlns="http://www.geni.net/resources/rspec/3"><node client_id="a"/></rspec>'


def test_missing_type_attribute_is_named_by_parse_and_validate():
    with pytest.raises(RSpecError) as err:
        parse(NO_TYPE, source="req.xml")
    assert "req.xml:1: the rspec element has no type attribute" in str(err.value)
    assert "None" not in str(err.value)
    problems = validate(NO_TYPE)
    assert len(problems) == 1 and "no type attribute" in problems[0].message


AMPERSANDS = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
              '<node client_id="n1"><services>'
              '<install url="https://example.org/t.tar.gz?a=1&amp;b=2" install_path="/"/>'
              '<execute shell="sh" command="make 2&gt;&amp;1 &amp;&amp; echo &quot;ok&quot; &#38; x"/>'
              '</services></node></rspec>')


def test_escaped_characters_in_attributes_arrive_as_written():
    """`&amp;` in an execute command or an install URL used to arrive as `&#38;` (lxml's
    parser target without entity resolution): `a 2>&1` ran as `a 2>&#38;1`."""
    node = parse(AMPERSANDS, source="req.xml").nodes[0]
    assert node.executes == [("sh", 'make 2>&1 && echo "ok" & x')]
    assert node.installs == [("https://example.org/t.tar.gz?a=1&b=2", "/")]
