"""Nodes leaving a slice are torn down in the background: given to no one before their old
processes are gone and their sandbox is wiped, even across an emulator restart."""
from __future__ import annotations

import uuid

from elasticslice.emulator import EmulatorServer
from elasticslice.rpc.codes import GeniCode
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import (Session, free_node, ok, processes_with,
                                                 stubborn_startup)

PINNED = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="mine" component_id="urn:publicid:IDN+emulab.test+node+{pc}"/>
</rspec>
"""


def test_a_node_being_torn_down_is_given_to_no_one_until_it_is_done(emulator):
    marker = f"stubborn-{uuid.uuid4().hex}"
    s = Session(emulator)
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    pc = free_node(emulator)   # a machine by name (the sliver's are drawn at random)
    pinned = PINNED.format(pc=pc)
    ok(s.cm.AddNodes({**args, "nodes": {"w": {"node": pc,
                                              "startup": stubborn_startup(marker)}}}))
    wait_for(lambda: processes_with(marker), timeout=30, what="startup running")
    wait_for(lambda: s.status(urn, cred)["status"] == "ready", timeout=30, what="ready")
    ok(s.cm.DeleteSlice(args))
    sandbox = emulator.dir / "nodes" / pc
    other, other_cred = s.register("other")
    other_args = {"slice_urn": other, "credentials": [other_cred]}
    early = s.cm.CreateSliver({**other_args, "rspec": pinned})
    if processes_with(marker):  # still being torn down when the request was answered
        assert early["code"] == GeniCode.BADARGS and "being reloaded" in early["output"]
    wait_for(lambda: not processes_with(marker), timeout=30, what="teardown")
    got = wait_for(lambda: (r := s.cm.CreateSliver({**other_args, "rspec": pinned}))["code"]
                   == 0 and r, timeout=30, what=f"{pc} free again")
    assert f"+node+{pc}" in got["value"][1]
    assert not (sandbox / "startup.log").exists()  # wiped before it was handed out


def test_restart_wipes_sandboxes_an_interrupted_teardown_left(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    held = {d["component_urn"].rsplit("+", 1)[-1] for d in s.status(urn, cred)["details"]
            .values()}
    directory = emulator.dir
    emulator.server.stop()
    # as if the emulator died after freeing a node but before wiping it (one the slice does
    # not hold: the CM gives an untyped node any free node)
    free = next(n for n in ("pc02", "pc03", "pc04") if n not in held)
    leftover = directory / "nodes" / free
    leftover.mkdir(parents=True)
    (leftover / "secret.txt").write_text("the last slice's data")
    for node_id in held:
        (directory / "nodes" / node_id).mkdir(parents=True, exist_ok=True)
    with EmulatorServer(directory, port=0, boot_delay=0.2) as again:
        emulator.server = again
        assert not leftover.exists()
        assert all((directory / "nodes" / n).is_dir() for n in held)  # slices keep theirs
