"""Dynamic-slice arguments the emulator used to accept or echo whole: a negative
defwaittime (silently the server's maximum), a 100 KB endpoint URL and a whole nodelist
item copied into the BADARGS answer."""
from __future__ import annotations

from elasticslice.rpc.codes import GeniCode
from tests.elasticslice.emulator.helpers import Session


def test_bad_endpoint_and_values_are_badargs_with_short_answers(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    base = {"slice_urn": urn, "credentials": [cred], "url": "https://127.0.0.1:9/cb"}
    negative = s.dyn.SetSliceClientEndpoint({**base, "defwaittime": -5})
    assert negative["code"] == GeniCode.BADARGS and "defwaittime" in negative["output"]
    huge = s.dyn.SetSliceClientEndpoint({**base, "url": "https://" + "a" * 100_000})
    assert huge["code"] == GeniCode.BADARGS and len(huge["output"]) < 200
    values = s.dyn.SetResourceValues({"slice_urn": urn, "credentials": [cred],
                                      "nodelist": [{"node_id": "x" * 10_000, "value": 0.5}]})
    assert values["code"] == GeniCode.BADARGS and len(values["output"]) < 200
    assert s.dyn.GetVersion({})["code"] == GeniCode.SUCCESS  # still serving


def test_any_refusal_quoting_a_huge_argument_stays_short(emulator):
    s = Session(emulator)
    answer = s.sa.Register({"credential": s.user_cred, "hrn": "a" * 100_000, "type": "Slice"})
    assert answer["code"] == GeniCode.BADARGS
    assert len(answer["output"]) < 1100 and answer["output"].endswith("(truncated)")
