"""CreateSliver holds requests to the rules AddNodes and `rspec validate` apply."""
from __future__ import annotations

import pytest

from elasticslice.rpc.codes import GeniCode
from tests.elasticslice.emulator.helpers import Session

V3 = 'xmlns="http://www.geni.net/resources/rspec/3"'


@pytest.mark.parametrize("rspec, output", [
    # broke: accepted, though AddNodes refuses the same client_id
    (f'<rspec {V3} type="request"><node client_id="../../x"/></rspec>',
     "node client_id '../../x': client_id must be 1-64 letters"),
    # broke: accepted, though `rspec validate` calls it not well-formed
    (f'<rspec {V3} xmlns:a="urn:x" xmlns:b="urn:x" type="request">'
     '<node client_id="n" a:f="1" b:f="2"/></rspec>',
     "not well-formed XML: Namespaced Attribute f in 'urn:x' redefined"),
    # broke: a manifest was allocated as if it were a request (the client refuses it)
    (f'<rspec {V3} type="manifest"><node client_id="n"/></rspec>',
     "A manifest is not a request rspec"),
    # broke: accepted, then the node failed to boot: "Argument list too long"
    (f'<rspec {V3} type="request"><node client_id="n"><services>'
     f'<execute shell="sh" command="{"true;" * 14000}"/></services></node></rspec>',
     "node n: execute: the command is 70000 bytes, more than the limit of 65536"),
    # broke: `rspec build --image URN` wrote the placeholder; CloudLab refuses it
    (f'<rspec {V3} type="request"><node client_id="n"><sliver_type name="raw-pc">'
     '<disk_image name="URN"/></sliver_type></node></rspec>',
     "node n: disk image 'URN' is not an image URN"),
])
def test_create_sliver_refuses_what_the_other_paths_refuse(emulator, rspec, output):
    s = Session(emulator)
    urn, cred = s.register()
    got = s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]})
    assert got["code"] == GeniCode.BADARGS and output in got["output"]
    assert s.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"] \
        == GeniCode.SEARCHFAILED  # nothing was allocated
