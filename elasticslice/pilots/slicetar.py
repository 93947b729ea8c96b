"""One install tarball for the whole slice, at one URL that outlives the control node's restarts.

CloudLab's CM fetches every tarball URL of a sliver again at every CreateSliver, AddNodes and
DeleteNodes (Emulab's ``tbsetup/tarfiles_setup``, run by ``GeniCM.pm`` ``SliverWorkAux``),
once per distinct URL, from the ops server, and a URL that cannot be fetched fails the call.
A URL per node would make each sliver change cost one fetch per node held, and a URL that a
restarted control node no longer serves would fail every later AddNodes and DeleteNodes: the
slice could neither grow nor give a node back. So the nodes of one slice share one tarball:

* :class:`SliceTarball` builds it: the files every node gets (``common``), and the files of
  single nodes under ``<install>/nodes/<client_id>/`` (a pilot's enrolment token until it is
  spent, a Parsl node's block), remade atomically whenever they change. Nodes install
  whatever copy the CM fetched at the last sliver change, which holds the files of every
  node not yet set up. Members are root's, as CloudLab unpacks them (as root, with the
  archive's owners and modes): the start script takes what it needs with ``sudo``.
* :class:`PublishedSlice` keeps its URL: the publisher's port and URL token live in
  ``<state_dir>/publish.json`` (0600), so a restarted ``elasticslice run``, Dask or Parsl
  cluster serves the same URL; a port that is taken then is an error naming it.
"""
from __future__ import annotations

import io
import logging
import os
import tarfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.publish import PublishError, TarballPublisher, TOKEN, new_token
from elasticslice.pilots.restart import read_json, write_json
from elasticslice.rpc import pki

log = logging.getLogger(__name__)

NAME = "slice.tar.gz"
NODES = "nodes"


@dataclass(frozen=True)
class Member:
    """A file of the tarball: its bytes and mode (owned by root)."""

    data: bytes
    mode: int = 0o644


class SliceTarball:
    """The tarball at ``path`` (0600: it may hold enrolment tokens), unpacked at ``/`` with its
    files under ``install`` (``/local/pilot``): ``common`` files for every node and, per
    node, the files :meth:`set_node` gives it (under folders only root may enter, unless not
    ``private``)."""

    def __init__(self, path: Path, install: str, common: Mapping[str, Member], *,
                 private: bool = True) -> None:
        if not install.startswith("/") or install.rstrip("/") == "":
            raise ValueError(f"install must be an absolute folder, not {install!r}")
        self.path = Path(path)
        self.top = install.strip("/")
        self.common = dict(common)
        self.folder_mode = 0o700 if private else 0o755  # of nodes/ and nodes/<client_id>/
        self._nodes: dict[str, dict[str, Member]] = {}
        self._lock = threading.Lock()

    def set_common(self, common: Mapping[str, Member]) -> None:
        with self._lock:
            self.common = dict(common)
        self.write()

    def set_node(self, client_id: str, files: Mapping[str, Member]) -> None:
        """The files only ``client_id`` needs (replacing its earlier ones); remade now."""
        with self._lock:
            self._nodes[client_id] = dict(files)
        self.write()

    def drop_node(self, client_id: str) -> None:
        """``client_id`` needs its files no more (set up, or gone); remade now."""
        with self._lock:
            if self._nodes.pop(client_id, None) is None:
                return
        self.write()

    def drop_all(self) -> None:
        with self._lock:
            self._nodes.clear()
        self.write()

    def nodes(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._nodes)

    def write(self) -> Path:
        """Make the tarball (atomically: a fetch in flight reads the old or the new one)."""
        with self._lock:
            data = self._build()
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            pki.write_private_file(tmp, data)
            os.replace(tmp, self.path)
        return self.path

    def _build(self) -> bytes:
        now = int(time.time())
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            parts = self.top.split("/")
            for depth in range(1, len(parts) + 1):  # the folders down to the install path
                _dir(tar, "/".join(parts[:depth]), 0o755, now)
            for name, member in sorted(self.common.items()):
                _file(tar, f"{self.top}/{name}", member, now)
            if self._nodes:
                _dir(tar, f"{self.top}/{NODES}", self.folder_mode, now)
            for client_id, files in sorted(self._nodes.items()):
                _dir(tar, f"{self.top}/{NODES}/{client_id}", self.folder_mode, now)
                for name, member in sorted(files.items()):
                    _file(tar, f"{self.top}/{NODES}/{client_id}/{name}", member, now)
        return buf.getvalue()


def _dir(tar: tarfile.TarFile, name: str, mode: int, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, mtime
    info.uname = info.gname = "root"
    tar.addfile(info)


def _file(tar: tarfile.TarFile, name: str, member: Member, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(member.data), member.mode, mtime
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(member.data))


class PublishedSlice:
    """The publisher of a state directory: its port and URL token kept in
    ``<state_dir>/publish.json``, so the URLs it gives stay the same across restarts.
    ``port``: a fixed port (``--publish-port``; None: the one kept, else any free one)."""

    FILE = "publish.json"

    def __init__(self, state_dir: Path, host: str, *, port: int | None = None,
                 public_url: str | None = None) -> None:
        self.path = Path(state_dir) / self.FILE
        self.host, self.port, self.public_url = host, port, public_url
        self.publisher: TarballPublisher | None = None
        self.token = ""
        self.serving: list = []  # what serves through it (a wheelhouse root): closed with it

    def start(self) -> TarballPublisher:
        kept = self._kept()
        self.token = str(kept.get("token") or "") or new_token()
        port = self.port if self.port is not None else int(kept.get("port") or 0)
        try:
            self.publisher = TarballPublisher(self.host, port, public_url=self.public_url).start()
        except PublishError as err:
            if port and port == kept.get("port") and self.port is None:
                raise ElasticSliceError(
                    f"{err}: the nodes' tarball is at {self.host}:{port}, where CloudLab "
                    f"fetches it again at every sliver change; free the port (or give "
                    f"the slice back and start afresh)") from err
            raise
        write_json(self.path, {"port": self.publisher.port_bound, "token": self.token,
                               "host": self.host})
        return self.publisher

    def _kept(self) -> dict:
        data = read_json(self.path) or {}
        token = data.get("token")
        if token is not None and not (isinstance(token, str) and TOKEN.fullmatch(token)):
            raise ElasticSliceError(f"{self.path}: 'token' is not a publishing token; move "
                                    f"the file away to start afresh")
        port = data.get("port")
        if port is not None and not (isinstance(port, int) and 0 <= port < 65536):
            raise ElasticSliceError(f"{self.path}: 'port' is not a port; move the file away")
        return data

    def stop(self) -> None:
        """Stop serving, and close what served through it (:attr:`serving`)."""
        publisher, self.publisher = self.publisher, None
        if publisher is not None:
            publisher.stop()
        serving, self.serving = self.serving, []
        for part in serving:
            part.close()
