"""Who may sign what, tried as an attacker works: a second user of the same CA.

Mallory has her own certificate from the emulator's CA (``emulator add-user``), her own key,
and copies of the victim's credentials. None of that lets her act on the victim's slice;
only a delegation the victim signs does, and only as far as it goes.
"""
from __future__ import annotations

import datetime as dt

import pytest
from click.testing import CliRunner
from lxml import etree

from elasticslice.cli import cli
from elasticslice.config import load_config
from elasticslice.emulator.cm import ComponentManager
from elasticslice.emulator.dynamic import DynamicSliceService
from elasticslice.emulator.sa import SliceAuthority
from elasticslice.rpc import credential as cr
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from tests.elasticslice.emulator.helpers import (REQUEST, Session, ok, other_user, sign_with,
                                                 user_cert_pem)

UTC = dt.timezone.utc
VICTIM = "urn:publicid:IDN+emulab.test+user+elastic"
MALLORY = "urn:publicid:IDN+emulab.test+user+mallory"


def _in(**delta: float) -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(**delta)


class Victim:
    """The emulator's own user, with a slice ``victim`` of two nodes."""

    def __init__(self, emulator) -> None:
        self.s = Session(emulator)
        self.urn, self.cred, (self.sliver_cred, _) = self.s.create("victim")
        self.sliver_urn = cr.parse_credential(self.sliver_cred).target_urn
        self.gid = ok(self.s.sa.Resolve({"credential": self.s.user_cred, "type": "Slice",
                                         "urn": self.urn}))["gid"]
        self.cert = user_cert_pem(emulator.dir)
        self.key = (emulator.dir / "user.pem").read_bytes()
        self.password = emulator.password

    def snapshot(self) -> tuple:
        """What the victim sees of the slice: expiry, nodes, sliver expiry."""
        slice_cred = ok(self.s.sa.GetCredential({"credential": self.s.user_cred,
                                                 "type": "Slice", "urn": self.urn}))
        manifest = ok(self.s.cm.Resolve({"urn": self.urn, "credentials": [self.cred]}))
        root = etree.fromstring(manifest["manifest"].encode())
        nodes = sorted(n.get("client_id") for n in root.iter("{*}node"))
        return cr.expires_of(slice_cred), nodes, root.get("expires")

    def delegate(self, to_pem: str, **kw) -> str:
        return cr.delegate(self.cred, to_pem, self.cert, self.key, key_password=self.password,
                           **kw)


@pytest.fixture
def world(emulator):
    victim = Victim(emulator)
    mallory, files = other_user(emulator, "mallory")
    return victim, mallory, user_cert_pem(files.pem.parent), files


def _cm_calls(v: Victim, creds: list[str]) -> dict[str, dict]:
    base = {"slice_urn": v.urn, "credentials": creds}
    return {
        "Resolve": {"urn": v.urn, "credentials": creds},
        "DiscoverResources": {"credentials": creds},
        "CreateSliver": {**base, "rspec": REQUEST},
        "GetSliver": base,
        "SliverStatus": base,
        "RenewSlice": {**base, "expiration": _in(hours=10).isoformat()},
        "DeleteSlice": base,
        "DeleteSliver": {"sliver_urn": v.sliver_urn, "credentials": creds},
        "AddNodes": {**base, "nodes": {"evil": {}}},
        "DeleteNodes": {**base, "nodes": ["n1"]},
    }


def _dyn_calls(v: Victim, creds: list[str]) -> dict[str, dict]:
    base = {"slice_urn": v.urn, "credentials": creds}
    table = {"SetSliceClientEndpoint": {**base, "url": "https://127.0.0.1:9/"},
             "RemoveSliceClientEndpoint": base,
             "SetResourceValues": {**base, "nodelist": []}}
    taking = {m for m, names in DynamicSliceService.POSITIONAL.items() if "credentials" in names}
    assert taking <= set(table), "a dynslice method that takes credentials has no case here"
    return {m: p for m, p in table.items() if m in DynamicSliceService.METHODS}


def _refused_everywhere(session: Session, v: Victim, creds: list[str]) -> dict[str, str]:
    """Every credentialed CM and dynslice call with ``creds``: method -> output."""
    cm = _cm_calls(v, creds)
    assert set(cm) == ComponentManager.METHODS - {"GetVersion"}, "a CM method has no case"
    outputs = {}
    for module, calls in (("cm", cm), ("dyn", _dyn_calls(v, creds))):
        for method, params in calls.items():
            got = getattr(getattr(session, module), method)(params)
            assert got["code"] == GeniCode.FORBIDDEN, (module, method, got)
            outputs[method] = got["output"]
    return outputs


def _sa_refuses(session: Session, v: Victim, user_cred: str, slice_cred: str) -> None:
    calls = {"GetCredential": {"credential": user_cred, "type": "Slice", "urn": v.urn},
             "Resolve": {"credential": user_cred, "type": "Slice", "urn": v.urn},
             "Register": {"credential": user_cred, "type": "Slice", "hrn": "stolen"},
             "GetKeys": {"credential": user_cred},
             "RenewSlice": {"credential": slice_cred, "expiration": _in(days=10).isoformat()}}
    assert set(calls) == SliceAuthority.METHODS - {"GetVersion"}, "an SA method has no case"
    for method, params in calls.items():
        got = getattr(session.sa, method)(params)
        assert got["code"] == GeniCode.FORBIDDEN, (method, got)


def test_slice_credential_forged_by_another_user_of_the_ca_is_refused_everywhere(world):
    """The critical bug: Mallory signed a ten-year credential for the victim's slice with her
    own key, and the CM and SA took it."""
    v, mallory, mallory_pem, files = world
    before = v.snapshot()
    key, password = files.pem.read_bytes(), files.password.read_text().strip()

    def forge(target_urn: str, target_gid: str) -> str:
        cred = cr.Credential(owner_gid=mallory_pem, owner_urn=MALLORY, target_gid=target_gid,
                             target_urn=target_urn, expires=_in(days=3650))
        return cr.sign_credential(cred, mallory_pem, key, key_password=password)

    sliver_gid = cr.parse_credential(v.sliver_cred).target_gid
    forged = {"slice": forge(v.urn, v.gid), "sliver": forge(v.sliver_urn, sliver_gid),
              "delegation": cr.sign_delegation(
                  cr.Credential(owner_gid=mallory_pem, owner_urn=MALLORY, target_gid=v.gid,
                                target_urn=v.urn, expires=cr.expires_of(v.cred)),
                  v.cred, mallory_pem, key, key_password=password)}
    for name, xml in forged.items():
        outputs = _refused_everywhere(mallory, v, [xml])
        assert all("Could not verify credential" in out for out in outputs.values()), name
    assert "not its authority" in outputs_of(mallory, v, forged["slice"])
    assert "not signed by the owner" in outputs_of(mallory, v, forged["delegation"])
    self_made = forge(MALLORY, mallory_pem)
    _sa_refuses(mallory, v, self_made, forged["slice"])
    assert v.snapshot() == before


def outputs_of(session: Session, v: Victim, xml: str) -> str:
    return session.cm.SliverStatus({"slice_urn": v.urn, "credentials": [xml]})["output"]


def test_victims_own_credentials_presented_by_another_user_are_refused(world):
    v, mallory, _, _ = world
    before = v.snapshot()
    for creds in ([v.cred], [v.sliver_cred], [v.cred, v.sliver_cred]):
        outputs = _refused_everywhere(mallory, v, creds)
        assert all("This is not your credential" in out for out in outputs.values())
    _sa_refuses(mallory, v, v.s.user_cred, v.cred)
    assert v.snapshot() == before


def test_credentials_from_the_wrong_authority_or_for_another_gid_are_refused(world, emulator):
    """Signed with the emulator's own keys, but not as GENI allows: refused all the same."""
    v, mallory, mallory_pem, _ = world
    d = emulator.dir
    expires = cr.expires_of(v.cred)
    sliver_gid = cr.parse_credential(v.sliver_cred).target_gid
    mallorys_urn, _ = mallory.register("mallorys")
    other_gid = ok(mallory.sa.Resolve({"credential": mallory.user_cred, "type": "Slice",
                                       "urn": mallorys_urn}))["gid"]
    cases = {
        "slice, right gid, by the SA (control case)": (v.urn, v.gid, "sa"),
        "slice, the victim's user certificate as target_gid": (v.urn, v.cert, "sa"),
        "slice, another user's certificate as target_gid": (v.urn, mallory_pem, "sa"),
        "slice, the GID of another slice": (v.urn, other_gid, "sa"),
        "slice, signed by the CM": (v.urn, v.gid, "cm"),
        "sliver, signed by the SA": (v.sliver_urn, sliver_gid, "sa"),
        "sliver, signed by the CM (control case)": (v.sliver_urn, sliver_gid, "cm"),
    }
    for name, (target, gid, signer) in cases.items():
        xml = sign_with(d, v.cert, VICTIM, target, expires, signer=signer, target_gid=gid)
        got = v.s.cm.SliverStatus({"slice_urn": v.urn, "credentials": [xml]})
        if "control case" in name:
            assert got["code"] == 0, (name, got)
        else:
            assert got["code"] == GeniCode.FORBIDDEN, (name, got)
            assert "target_gid" in got["output"] or "not its authority" in got["output"]


def test_delegated_slice_credential_works_within_what_it_grants(world, emulator):
    v, mallory, mallory_pem, _ = world
    full = v.delegate(mallory_pem, expires=_in(hours=1))
    args = {"slice_urn": v.urn, "credentials": [full]}
    assert ok(mallory.cm.SliverStatus(args))["details"]
    ok(mallory.cm.AddNodes({**args, "nodes": {"m1": {}}}))
    assert "m1" in v.snapshot()[1]
    sliver_xml = ok(mallory.cm.GetSliver(args))
    sliver_cred = cr.parse_credential(sliver_xml)
    assert sliver_cred.owner_urn == MALLORY and sliver_cred.expires <= cr.expires_of(full)
    again = ok(mallory.cm.GetSliver({"slice_urn": v.urn, "credentials": [sliver_xml]}))
    assert cr.expires_of(again) <= cr.expires_of(full)  # asking again does not extend it
    renewed = ok(mallory.sa.RenewSlice({"credential": full,
                                        "expiration": _in(hours=30).isoformat()}))
    assert cr.expires_of(renewed) == cr.expires_of(full)  # no wider than the delegation
    assert v.snapshot()[0] >= _in(hours=29)  # the slice itself was renewed

    info = v.delegate(mallory_pem, privileges=["info"], expires=_in(hours=1))
    args = {"slice_urn": v.urn, "credentials": [info]}
    assert ok(mallory.cm.SliverStatus(args))["details"]
    # reading is all 'info' needs, the advertisement included (it asked for 'control')
    assert "advertisement" in ok(mallory.cm.DiscoverResources({"credentials": [info],
                                                               "rspec_version": "3"}))
    for method, extra in (("AddNodes", {"nodes": {"m2": {}}}), ("DeleteSlice", {}),
                          ("DeleteNodes", {"nodes": ["m1"]})):
        got = getattr(mallory.cm, method)({**args, **extra})
        assert got["code"] == GeniCode.FORBIDDEN and "'control'" in got["output"], got
    narrow = ok(mallory.cm.GetSliver(args))
    assert cr.parse_credential(narrow).privileges == [("info", False)]
    narrow = ok(mallory.cm.GetSliver({"slice_urn": v.urn, "credentials": [narrow]}))
    assert cr.parse_credential(narrow).privileges == [("info", False)]  # still narrow
    assert cr.expires_of(narrow) <= cr.expires_of(info)
    got = mallory.cm.DeleteNodes({"slice_urn": v.urn, "credentials": [narrow], "nodes": ["m1"]})
    assert got["code"] == GeniCode.FORBIDDEN
    assert mallory.sa.RenewSlice({"credential": info, "expiration": _in(hours=40).isoformat()}
                                 )["code"] == GeniCode.FORBIDDEN
    carol, _ = other_user(emulator, "carol")  # a third user holding Mallory's delegation
    assert carol.cm.SliverStatus(args)["code"] == GeniCode.FORBIDDEN


def test_add_user_command_gives_a_working_second_user(emulator):
    d = emulator.dir
    result = CliRunner().invoke(cli, ["emulator", "add-user", "--dir", str(d), "bob"])
    assert result.exit_code == 0, result.output
    config = d / "users" / "bob" / "elasticslice.conf"
    assert str(config) in result.output
    with ProtoGeniServer(load_config(config)) as bob:
        assert bob.user_urn == "urn:publicid:IDN+emulab.test+user+bob"
        assert cr.parse_credential(bob.get_credential()).owner_urn == bob.user_urn
        bob.register_slice()
        assert bob.resolve_slice()["creator_urn"] == bob.user_urn
    again = CliRunner().invoke(cli, ["emulator", "add-user", "--dir", str(d), "bob"])
    assert again.exit_code != 0 and "already exists" in again.output
    assert "Traceback" not in again.output and len(again.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_docs_trust_model_example_runs(repo_root, monkeypatch, capsys):
    """The Python block of docs/emulator.md "Trust model: who may sign what", as written."""
    text = (repo_root / "docs" / "emulator.md").read_text()
    section = text.split("## Trust model: who may sign what", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(repo_root)
    exec(compile(code, "docs/emulator.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] in ("notready", "changing", "ready"), lines
    assert lines[1].startswith("3 ") and "'control'" in lines[1], lines
