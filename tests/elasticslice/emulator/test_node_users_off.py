"""Where the box cannot give nodes their users (not root: mapping them takes CAP_SETUID and
CAP_SETGID in this machine's user namespace), or nodes are not isolated at all, startup
commands still run, as root of the node or as the emulator's user, the runlog and sudo
still work, and ``serve`` says once at start why the startup command is not run as the
experiment's creator."""
from __future__ import annotations

import logging

import pytest

from elasticslice.emulator import isolate
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import add_node, exited, runlog

pytestmark = pytest.mark.slow

REASON = "not root: a node's user namespace maps its users only with CAP_SETUID and " \
         "CAP_SETGID in this machine's"
ONE_NODE = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="base"/></rspec>"""


@pytest.mark.skipif(isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
                    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")
def test_without_node_users_startup_runs_as_root_after_one_warning(emulator_factory,
                                                                     monkeypatch, caplog):
    monkeypatch.setattr(isolate, "_probe_users", lambda: REASON)  # as a user would see it
    caplog.set_level(logging.WARNING, logger="elasticslice.emulator")
    emulator = emulator_factory()
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    node = add_node(s, urn, cred, "w1", "id -u; sudo id -u; echo x > /made-by-root")
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    assert runlog(node).splitlines()[:2] == ["0", "0"]
    assert (node / "root" / "made-by-root").exists()
    warnings = [r.getMessage() for r in caplog.records if "node users off" in r.getMessage()]
    assert warnings == [f"node users off ({REASON}): startup commands run as root of the "
                        "node, not as the experiment's creator"]


def test_without_namespaces_sudo_runs_the_command_as_the_caller(emulator_factory,
                                                                monkeypatch):
    monkeypatch.setenv(isolate.ENV_VAR, "off")
    emulator = emulator_factory()
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    node = add_node(s, urn, cred, "w1", "sudo -n sh -c 'echo via sudo'; id -u")
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    said = runlog(node).splitlines()
    assert said[0] == "via sudo" and said[1].isdigit()
    assert (node / "root" / "var" / "emulab" / "logs").is_dir()  # the runlog in its folder
