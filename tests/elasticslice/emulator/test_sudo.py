"""Passwordless sudo for the node's users (docs/emulator.md, "CloudLab's rules, from its
source": R2), as CloudLab's images give it, with no setuid binary: the node's init serves
its users on a UNIX socket. The box's nodes had no sudo (this machine has none), so a start
script run as the user could not become root where it must."""
from __future__ import annotations

import json
import shutil

import pytest

from elasticslice.emulator import isolate, nodeusers
from tests.elasticslice.emulator.helpers import Session, make_tarball
from tests.elasticslice.emulator.node_helpers import add_node, exited, runlog

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not isolate.choose({}).users,
    reason=f"no node users here: {isolate.choose({}).users_reason or isolate.choose({}).reason}")]

ONE_NODE = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="base"/></rspec>"""


def _node(emulator, command: str, client_id: str = "w1"):
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    node = add_node(s, urn, cred, client_id, command)
    return exited(s, urn, cred, client_id)["execute_status"], node, node / "root" / "tmp"


def test_the_users_sudo_runs_commands_as_root_or_another_user(emulator):
    script = "; ".join([
        "sudo id -u > /tmp/root-id",
        "sudo -n -u elastic id -un > /tmp/user-id",
        "cd /tmp && sudo pwd > /tmp/cwd",                         # its working directory
        "echo piped | sudo cat > /tmp/stdin",                     # its stdin and stdout
        "sudo sh -c 'echo to-stderr >&2' 2> /tmp/stderr",          # its stderr
        "sudo sh -c 'echo $SUDO_USER $SUDO_UID $SUDO_GID $HOME $PATH' > /tmp/env",
        "ELASTICSLICE_MINE=1 sudo -E env > /tmp/env-kept",
        "sudo sh -c 'echo x > /root/made' && echo ROOT-WROTE > /tmp/root-wrote",
        "sudo false; echo $? > /tmp/false",
        "sudo -v; echo $? > /tmp/validate",
        "sudo -i true 2> /tmp/unsupported; echo $? >> /tmp/unsupported",
        "sudo no-such-command 2> /tmp/missing; echo $? >> /tmp/missing",
    ])
    status, node, tmp = _node(emulator, script)
    assert status == 0, runlog(node)
    uid = nodeusers.FIRST_UID
    assert (tmp / "root-id").read_text() == "0\n"
    assert (tmp / "user-id").read_text() == "elastic\n"
    assert (tmp / "cwd").read_text() == "/tmp\n"
    assert (tmp / "stdin").read_text() == "piped\n"
    assert (tmp / "stderr").read_text() == "to-stderr\n"
    sudo_user, sudo_uid, sudo_gid, home, path = (tmp / "env").read_text().split()
    assert (sudo_user, sudo_uid, home, path) == ("elastic", str(uid), "/root",
                                                 isolate.NODE_PATH)
    assert int(sudo_gid) >= nodeusers.FIRST_GID
    kept = dict(line.split("=", 1) for line in (tmp / "env-kept").read_text().splitlines())
    assert kept["ELASTICSLICE_MINE"] == "1" and kept["SUDO_USER"] == "elastic"
    assert (node / "root" / "root" / "made").stat().st_uid == 0  # root of the node: the host's
    assert (tmp / "root-wrote").exists()
    assert (tmp / "false").read_text() == "1\n" and (tmp / "validate").read_text() == "0\n"
    unsupported = (tmp / "unsupported").read_text().splitlines()
    assert unsupported == ["sudo: option -i is not supported by the box's sudo (it takes -n, "
                           "-E, -H, -u USER, -v, --)", "1"]
    assert (tmp / "missing").read_text().splitlines() == [
        "sudo: no-such-command: command not found", "1"]


def test_the_callers_signals_reach_the_command(emulator):
    """The user cannot signal the root command itself; signalling its sudo reaches it."""
    script = ("sudo sh -c 'trap \"echo TERM > /tmp/trapped; exit 7\" TERM; "
              "echo $$ > /tmp/command.pid; while :; do sleep 0.05; done' & sudo=$!; "
              "while [ ! -s /tmp/command.pid ]; do sleep 0.05; done; "
              "kill -TERM $(cat /tmp/command.pid) 2> /dev/null || echo DENIED > /tmp/direct; "
              "kill -TERM $sudo; wait $sudo; echo $? > /tmp/status")
    status, node, tmp = _node(emulator, script)
    assert status == 0, runlog(node)
    assert (tmp / "direct").read_text() == "DENIED\n"
    assert (tmp / "trapped").read_text() == "TERM\n"
    assert (tmp / "status").read_text() == "7\n"


# a hostile program on the node: a request of its own, with descriptors, on the socket
RAW = """import array, json, os, socket, struct
s = socket.socket(socket.AF_UNIX)
s.connect("/run/box-sudo/socket")
body = json.dumps({"argv": ["touch", "/tmp/raw-ran"]}).encode()
fds = array.array("i", [0, 1, 2, os.open("/", os.O_RDONLY)])
try:
    s.sendmsg([struct.pack("!I", len(body)) + body],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
except OSError:  # the refusal came first: the socket is closed
    pass
print(s.recv(1000).decode().strip())
"""


@pytest.mark.skipif(not shutil.which("setpriv"), reason="no setpriv (util-linux) here")
def test_a_process_of_a_uid_that_is_not_a_node_user_is_refused(emulator, file_server):
    """An attacker on the node with a uid of its own (4242: made by root with setpriv, as a
    service account would be): the box's sudo client, and a raw connection sending a
    request with descriptors, both refused before anything they sent is used; nor can it
    replace the socket."""
    make_tarball(file_server.root / "attack.tgz", {"local/attack.py": RAW})
    as_4242 = "sudo setpriv --reuid=4242 --regid=4242 --clear-groups"
    script = "; ".join([
        f"{as_4242} sudo touch /tmp/client-ran > /tmp/client 2>&1; echo $? >> /tmp/client",
        f"{as_4242} python3 /local/attack.py > /tmp/raw 2>&1",
        f"{as_4242} rm -f /run/box-sudo/socket 2> /dev/null || echo KEPT > /tmp/socket",
        "sudo id -u > /tmp/still-served",
    ])
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    node = add_node(s, urn, cred, "w1", script, tarballs=[f"{file_server.url}/attack.tgz"])
    assert exited(s, urn, cred, "w1")["execute_status"] == 0, runlog(node)
    tmp = node / "root" / "tmp"
    refused = "sudo: uid 4242 is not a user of this node: the box's sudo serves the node's " \
              "users only"
    assert (tmp / "client").read_text().splitlines() == [refused, "1"]
    assert (tmp / "raw").read_text() == json.dumps({"status": 1, "error": refused}) + "\n"
    assert not (tmp / "client-ran").exists() and not (tmp / "raw-ran").exists()
    assert (tmp / "socket").read_text() == "KEPT\n"
    assert (tmp / "still-served").read_text() == "0\n"
