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
