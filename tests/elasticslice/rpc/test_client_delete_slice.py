"""DeleteSlice through the real client: ``cancel`` and ``blocking`` (PROTOCOL.md), and a slice
whose processes are slow to die does not stall other slices' calls (issue 7 §3)."""
from __future__ import annotations

import datetime as dt
import threading
import uuid

import geni.rspec.pg as pg
import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.errors import RPCError
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import parse
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, ok, processes_with, stubborn_startup

from .helpers import hours


def _request(names: list[str], startup: str | None = None,
             component_ids: dict[str, str] | None = None) -> str:
    request = pg.Request()
    for name in names:
        node = pg.RawPC(name)
        if startup:
            node.addService(pg.Execute(shell="sh", command=startup))
        if component_ids:
            node.component_id = component_ids[name]
        request.addResource(node)
    return request.toXMLString(pretty_print=True).decode("utf-8")


def _gone(server) -> bool:
    try:
        server.sliver_status()
    except RPCError as err:
        return err.code == GeniCode.SEARCHFAILED
    return False


def test_delete_slice_while_setting_up_is_busy_unless_cancelled(emu):
    emu.server.settings.boot_delay = 600  # the nodes stay in setup
    with emu.client() as server:
        server.register_slice(expiration=hours(4))
        _, manifest = server.create_sliver(_request(["a", "b"]))
        with pytest.raises(RPCError) as info:
            server.delete_slice()
        assert info.value.code == GeniCode.BUSY
        assert {n.client_id for n in server.sliver_status().nodes} == {"a", "b"}
        server.delete_slice(cancel=True, blocking=True)
        assert _gone(server)
        # complete when it returns: the very same physical nodes can be had again at once
        pinned = {n.client_id: n.component_id for n in parse(manifest).nodes}
        _, again = server.create_sliver(_request(["a", "b"], component_ids=pinned))
        assert {n.component_id for n in parse(again).nodes} == set(pinned.values())


def test_cli_delete_slice_cancel_and_blocking(emu):
    emu.server.settings.boot_delay = 600
    with emu.client() as server:
        server.register_slice(expiration=hours(4))
        server.create_sliver(_request(["a"]))
    base = ["--config", str(emu.config_path), "delete-slice"]
    busy = CliRunner().invoke(cli, base)
    assert busy.exit_code != 0 and "BUSY" in busy.output and "Traceback" not in busy.output
    done = CliRunner().invoke(cli, [*base, "--cancel", "--blocking"])
    assert done.exit_code == 0, done.output
    assert "deleted" in done.output
    with emu.client() as server:
        assert _gone(server)


def test_delete_slice_continues_in_the_background_unless_blocking(emu):
    marker = f"stubborn-{uuid.uuid4().hex}"
    with emu.client() as server:
        server.register_slice(expiration=hours(4))
        server.create_sliver(_request(["a"], stubborn_startup(marker)))
        wait_for(lambda: processes_with(marker), timeout=30, what="startup running")
        server.delete_slice()
        # answered at once: the node's process ignores SIGTERM and is still being stopped
        assert processes_with(marker)
        assert _gone(server)
        wait_for(lambda: not processes_with(marker), timeout=30, what="teardown finished")


def test_other_slices_answer_while_a_slice_with_stubborn_processes_is_torn_down(emu):
    marker = f"stubborn-{uuid.uuid4().hex}"
    other = Session(emu)  # another slice, its own client and connection
    b_urn, b_cred, _ = other.create("other")
    b_args = {"slice_urn": b_urn, "credentials": [b_cred]}
    renew_to = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    extra = iter(range(100))

    def add_and_delete() -> dict:
        name = f"b{next(extra)}"
        ok(other.cm.AddNodes({**b_args, "nodes": {name: {}}}))
        return other.cm.DeleteNodes({**b_args, "nodes": [name]})

    calls = [("RenewSlice", lambda: other.cm.RenewSlice({**b_args, "expiration": renew_to})),
             ("AddNodes+DeleteNodes", add_and_delete),
             ("SliverStatus", lambda: other.cm.SliverStatus(b_args)),
             ("GetVersion", lambda: other.cm.GetVersion({}))]
    with emu.client() as server:
        server.register_slice(expiration=hours(4))
        server.create_sliver(_request([f"s{i}" for i in range(5)], stubborn_startup(marker)))
        wait_for(lambda: len(processes_with(marker)) == 5, timeout=60,
                 what="five stubborn startups running")
        a_args = {"slice_urn": server.slice_urn(), "credentials": [server.get_slice_credential()]}
        result: dict[str, object] = {}

        def delete() -> None:
            server.delete_slice(blocking=True)
            result["left at return"] = processes_with(marker)

        deleter = threading.Thread(target=delete)
        deleter.start()
        # the slice is gone for its user at once; its processes are being stopped
        wait_for(lambda: other.cm.SliverStatus(a_args)["code"] == GeniCode.SEARCHFAILED,
                 timeout=30, what="slice deleted")
        during: list[str] = []  # calls of the other slice answered before teardown ended
        for i in range(40):
            if not processes_with(marker):
                break
            name, call = calls[i % len(calls)]
            assert call()["code"] == 0, name
            if processes_with(marker):
                during.append(name)
        deleter.join(timeout=60)
        assert not deleter.is_alive()
    assert {"RenewSlice", "AddNodes+DeleteNodes"} <= set(during), during
    assert len(during) >= 3, during
    assert result["left at return"] == []  # blocking: complete when it returned
