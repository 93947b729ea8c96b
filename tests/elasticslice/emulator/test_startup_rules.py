"""A startup command runs as CloudLab's boot scripts run it (docs/emulator.md, "CloudLab's
rules, from its source": R1, R3, R4, R5). The box ran it as root with HOME=/root, each
execute service with its own shell, its output in a file on the host: a start script that
needed root, a writable HOME or bash worked in the box and broke on CloudLab."""
from __future__ import annotations

import os
import re
import stat

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import isolate, nodeusers, startup
from tests.elasticslice.emulator.helpers import Session, other_user
from tests.elasticslice.emulator.node_helpers import add_node, detail_of, exited, runlog

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not isolate.choose({}).users,
    reason=f"no node users here: {isolate.choose({}).users_reason or isolate.choose({}).reason}")]

ONE_NODE = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="base"/></rspec>"""


def _slice(s: Session) -> tuple[str, str]:
    urn, cred, _ = s.create(rspec=ONE_NODE)
    return urn, cred


def test_startup_runs_as_the_creator_with_its_group_and_a_home(emulator):
    """R1: tmcd sends ``UID=<swapper>``; runstartup takes the login's uid, gid and groups
    (``id -G``). The creator's files are the node user's, on the host too."""
    s = Session(emulator)
    urn, cred = _slice(s)
    node = add_node(s, urn, cred, "w1", "id -un; id -u; id -gn; id -G; ls -ld /users/elastic "
                                        "| cut -d' ' -f3; touch /tmp/mine")
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    login, uid, group, groups, home_owner, _returned = runlog(node).splitlines()
    assert (login, group, home_owner) == ("elastic", "elasticslice", "elastic")
    assert int(uid) >= nodeusers.FIRST_UID and groups.split() == [
        line.split(":")[2] for line in (node / "layer" / "etc" / "group").read_text()
        .splitlines() if line.startswith("elasticslice:")]
    mine = (node / "root" / "tmp" / "mine").stat()
    assert mine.st_uid == nodeusers.host_id(int(uid)) == nodeusers.HOST_ID_BASE + int(uid)


def test_a_creator_without_an_account_is_runstartups_fatal_666(emulator):
    """runstartup's ``fatal("Could not determine UID for $login")``: status 666. A login
    that is one of the image's own accounts (here ``daemon``) gets no account of the node."""
    s, _files = other_user(emulator, "daemon")
    urn, cred = _slice(s)
    node = add_node(s, urn, cred, "w1", "touch /tmp/ran")
    assert exited(s, urn, cred, "w1")["execute_status"] == 666
    assert runlog(node) == "Could not determine UID for daemon\n"
    assert not (node / "root" / "tmp" / "ran").exists()


def test_home_path_and_working_directory_are_the_boot_scripts(emulator):
    """R3: runstartup changes neither the environment nor the directory: HOME is root's
    (which the user cannot write), the working directory /, stdin /dev/null."""
    s = Session(emulator)
    urn, cred = _slice(s)
    node = add_node(s, urn, cred, "w1",
                    'pwd; echo "$HOME"; echo "$PATH"; test -w "$HOME" || echo HOME-READ-ONLY; '
                    "test -w . || echo CWD-READ-ONLY; cat; echo end")
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    assert runlog(node).splitlines()[:-1] == [
        "/", "/root", isolate.NODE_PATH, "HOME-READ-ONLY", "CWD-READ-ONLY", "end"]


def test_output_goes_to_a_runlog_ending_with_the_command_and_its_status(emulator):
    """R4: ``/var/emulab/logs/runlog.XXXXXX`` on the node's disk (mode 0644, the user's),
    ``<command> returned <status>`` at its end, the status in SliverStatus; ``emulator log``
    prints it, with the server running or not."""
    s = Session(emulator)
    urn, cred = _slice(s)
    command = "echo out; cat /no-such-file; exit 3"  # stderr too (no &: CloudLab's XML)
    node = add_node(s, urn, cred, "w1", command)
    assert exited(s, urn, cred, "w1")["execute_status"] == 3
    (path,) = (node / "runlogs").read_text().split()
    assert re.fullmatch(r"/var/emulab/logs/runlog\.[A-Za-z0-9]{6}", path)
    info = (node / "root" / path.lstrip("/")).stat()
    assert stat.S_IMODE(info.st_mode) == 0o644 and info.st_uid == nodeusers.host_id(
        nodeusers.FIRST_UID)
    assert runlog(node) == (f"out\ncat: /no-such-file: No such file or directory\n"
                            f"{command} returned 3\n")
    assert not (node / "startup.log").read_text()  # the init itself had nothing to say
    result = CliRunner().invoke(cli, ["emulator", "log", "--dir", str(emulator.dir),
                                      node.name])
    assert result.exit_code == 0 and result.output == runlog(node), result.output
    emulator.server.stop()
    offline = CliRunner().invoke(cli, ["emulator", "log", "--dir", str(emulator.dir),
                                       node.name])
    assert offline.exit_code == 0 and offline.output == result.output


def test_a_command_killed_by_a_signal_returns_0_as_runstartup_computes_it(emulator):
    """runstartup reports ``$? >> 8``: 0 for a command killed by a signal."""
    s = Session(emulator)
    urn, cred = _slice(s)
    node = add_node(s, urn, cred, "w1", "kill -KILL $$")
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    assert runlog(node) == "kill -KILL $$ returned 0\n"


def test_one_execute_service_runs_with_bin_sh_whatever_its_shell(emulator):
    """R5: one execute service keeps its command, not its shell: Perl's exec of one string
    is ``/bin/sh -c`` (dash on the images), so a bashism fails."""
    rspec = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <node client_id="a"><services><execute shell="bash"
        command="echo ${BASH_VERSION:-no-bash}; [[ 1 == 1 ]] &amp;&amp; echo bash-test"/>
      </services></node></rspec>"""
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=rspec)
    node_id = detail_of(s, urn, cred, "a")["component_urn"].rsplit("+", 1)[-1]
    assert exited(s, urn, cred, "a")["execute_status"] == 127  # [[: not found
    text = runlog(emulator.dir / "nodes" / node_id)
    assert text.splitlines()[0] == "no-bash" and "bash-test\n" not in text


def test_several_execute_services_run_in_the_cms_geni_startup_wrapper(emulator):
    """Several execute services: the CM's wrapper, as GeniCM.pm.in writes it, is the
    startup command; it exits 0 whatever they do, each service's output and status in
    /var/tmp; dash reads its ``exec &>`` as a background exec and an empty redirection, so
    the wrapper's own lines go to the runlog and /var/tmp/startup.log stays empty."""
    rspec = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <node client_id="a"><services>
        <execute shell="sh" command="echo first; id -un"/>
        <execute shell="/bin/sh" command="echo second &gt;&amp;2; exit 5"/>
      </services></node></rspec>"""
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=rspec)
    node_id = detail_of(s, urn, cred, "a")["component_urn"].rsplit("+", 1)[-1]
    assert exited(s, urn, cred, "a")["execute_status"] == 0
    node = emulator.dir / "nodes" / node_id
    wrapper = node / "geni" / "geni_startup.a"  # /var/emulab/boot/geni/geni_startup.a
    assert wrapper.read_text() == startup.geni_startup(
        [["sh", "echo first; id -un"], ["/bin/sh", "echo second >&2; exit 5"]])
    assert os.access(wrapper, os.X_OK)
    tmp = node / "root" / "var" / "tmp"
    assert (tmp / "startup-0.txt").read_text() == "first\nelastic\n"
    assert (tmp / "startup-1.txt").read_text() == "second\n"
    assert [(tmp / f"startup-{i}.status").read_text() for i in (0, 1)] == ["0\n", "5\n"]
    assert (tmp / "startup.log").read_text() == ""
    lines = runlog(node).splitlines()
    assert lines[0].startswith("Services execution 0 at ")
    assert "Execution 1 exited with status 5" in lines
    assert lines[-1] == "/var/emulab/boot/geni/geni_startup.a returned 0"


def test_log_of_an_unknown_node_or_one_without_a_runlog_is_one_line(emulator):
    s = Session(emulator)
    urn, cred = _slice(s)
    base = detail_of(s, urn, cred, "base")["component_urn"].rsplit("+", 1)[-1]
    for node, said in (("nosuch", "no node nosuch in"), ("../../etc", "is not a node id"),
                       (base, "has no runlog")):
        result = CliRunner().invoke(cli, ["emulator", "log", "--dir", str(emulator.dir),
                                          node])
        assert result.exit_code == 1 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in \
            result.output
