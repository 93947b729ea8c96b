"""Tarballs are unpacked as install-tarfile does it (docs/emulator.md, "CloudLab's rules,
from its source": R8): as root, ``umask 0``, ``tar -xvf``, so with the archive's owners and
modes. The box dropped the owners (everything root's) and changed modes: a tarball of
root-owned 0700 files worked in the box and was out of the user's reach on CloudLab."""
from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from elasticslice.emulator import isolate, nodeusers
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import add_node, exited, runlog

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not isolate.choose({}).users,
    reason=f"no node users here: {isolate.choose({}).users_reason or isolate.choose({}).reason}")]

USER = nodeusers.FIRST_UID  # elastic, the first login of a node
MEMBERS = [  # name, uid, gid, mode, text (None: a folder)
    ("local/app", USER, 6000, 0o750, None),
    ("local/app/run.sh", USER, 6000, 0o750, "#!/bin/sh\necho ran as $(id -un)\n"),
    ("local/app/secret", 0, 0, 0o600, "root only\n"),
    ("local/app/setuid", 0, 0, 0o4755, "#!/bin/sh\n"),
    ("local/app/theirs", 4242, 4242, 0o644, "another uid's\n"),
    ("local/app/shared/data", 0, 0, 0o644, "in a folder the archive does not hold\n"),
    ("local/app/far", 100000, 100000, 0o644, "a uid beyond the node's\n"),
]


def _tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, uid, gid, mode, text in MEMBERS:
            info = tarfile.TarInfo(name)
            info.uid, info.gid, info.mode, info.uname, info.gname = uid, gid, mode, "", ""
            if text is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                data = text.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_tarballs_are_unpacked_with_the_archives_owners_and_modes(emulator, file_server):
    _tarball(file_server.root / "app.tgz")
    s = Session(emulator)
    urn, cred, _ = s.create(rspec="""<rspec xmlns="http://www.geni.net/resources/rspec/3"
                                      type="request"><node client_id="base"/></rspec>""")
    node = add_node(s, urn, cred, "w1", "/local/app/run.sh; cat /local/app/secret; true",
                    tarballs=[f"{file_server.url}/app.tgz"])
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    app = node / "root" / "local" / "app"

    def owner_mode(name: str) -> tuple[int, int, int]:
        info = (app / name).stat()
        return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)

    node_user = nodeusers.host_id(USER)
    assert owner_mode(".") == (node_user, nodeusers.host_id(6000), 0o750)
    assert owner_mode("run.sh") == (node_user, nodeusers.host_id(6000), 0o750)
    assert owner_mode("secret") == (0, 0, 0o600)          # node root is the host's root
    assert owner_mode("setuid") == (0, 0, 0o755)          # setuid dropped: a host folder
    assert owner_mode("theirs")[:2] == (nodeusers.host_id(4242),) * 2
    assert owner_mode("far")[:2] == (0, 0)                 # chown failed: the unpacker's
    assert owner_mode("shared")[2] == 0o777                # GNU tar's folder under umask 0
    said = runlog(node).splitlines()
    assert said[0] == "ran as elastic"                     # the user's own script
    assert said[1] == "cat: /local/app/secret: Permission denied"  # root's is not
