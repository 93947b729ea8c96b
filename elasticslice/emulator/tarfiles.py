"""The CM's tarfiles step: install tarballs fetched by the testbed, as CloudLab does it.

Source: ``protogeni/lib/GeniCM.pm.in`` ``SliverWorkAux`` runs ``tbsetup/tarfiles_setup``
after the mapper on every CreateSliver, AddNodes and DeleteNodes, and fails the call with
BADARGS "Could not setup tarfiles: ..." when it fails. ``tarfiles_setup`` walks every node
of the experiment (``virt_nodes``) and fetches each distinct URL (``%tofetch`` is keyed by
URL) one after another, with no "already have it" check, each with one
``tbsetup/fetchtar.proxy`` over ssh on the ops server; it keeps the copy as
``<md5 of the URL>.<ext>`` in the experiment's directory, where nodes install from.

The box does the same (:meth:`TarfileStore.fetch_all`, then :meth:`TarfileStore.commit`):
every distinct URL the sliver will hold after the change is fetched again, one after another,
outside the sliver lock, into a staging folder; only when all succeed do the new copies
replace the kept ones, under the lock, so a failed call changes nothing. The kept copy of a
URL has a stable path (:meth:`TarfileStore.kept`), ``D/tarfiles/<slice>/<md5>.<ext>``; a copy
whose content changed gets a new modification time and ``changed_at`` in the folder's
``index.json`` (:meth:`TarfileStore.record`); an unchanged one is left as it was. Each tarball
must pass the rule of :mod:`elasticslice.rspec.tarball`; the box fetches over http or https,
no proxy, and is offline, so only hosts on this machine answer. A string that is not a URL
is a path on the testbed's server, and the box's server has no files. Any failure is BADARGS
``Could not setup tarfiles: ...`` naming the tarball. Under ``--latency cloudlab`` each URL
costs what one fetchtar.proxy costs and a refused connection is tried again as wget would
(:mod:`elasticslice.emulator.pace`).
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.pace import Latency
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec.tarball import is_url, setup_failed, stored_name, tarball_problem

log = logging.getLogger(__name__)

FETCH_TIMEOUT = 30.0
MAX_TARBALL_BYTES = 512 * 1024 * 1024
CHUNK = 1 << 20


def _refuse(detail: str) -> GeniFault:
    return GeniFault(GeniCode.BADARGS, setup_failed(detail))


# the control machine's addresses on the box's control networks (network.py): this machine
BOX_HOSTS: set[str] = set()


def _local_host(host: str | None) -> bool:
    if host == "localhost" or host in BOX_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


@dataclass
class KeptCopy:
    """A kept tarball: its stable path, the MD5 of its content, when its content last
    changed and when it was last fetched (epoch seconds)."""

    path: Path
    md5: str
    changed_at: float
    fetched_at: float


@dataclass
class Staging:
    """The copies one tarfiles step fetched (URL -> file, and its MD5), not yet the
    sliver's."""

    path: Path
    files: dict[str, Path] = field(default_factory=dict)
    md5: dict[str, str] = field(default_factory=dict)


class TarfileStore:
    """The kept tarballs of every sliver, under ``D/tarfiles``."""

    INDEX = "index.json"

    def __init__(self, directory: Path, latency: Latency | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = directory / "tarfiles"
        self.latency = latency or Latency()
        self.clock = clock

    def sliver_dir(self, slice_urn: str) -> Path:
        digest = hashlib.sha256(slice_urn.encode("utf-8")).hexdigest()[:24]
        return self.root / digest

    def kept(self, slice_urn: str, url: str) -> Path:
        """Where the sliver's copy of ``url`` is (it may not exist): the same path for as
        long as the sliver holds the URL."""
        return self.sliver_dir(slice_urn) / stored_name(url)

    def record(self, slice_urn: str, url: str) -> KeptCopy | None:
        """The kept copy of ``url`` and when it last changed (None: none is kept)."""
        entry = self._index(self.sliver_dir(slice_urn)).get(stored_name(url))
        path = self.kept(slice_urn, url)
        if entry is None or not path.exists():
            return None
        return KeptCopy(path, entry["md5"], entry["changed_at"], entry["fetched_at"])

    # ---- the step
    def fetch_all(self, sources: Iterable[str]) -> Staging:
        """Fetch every distinct tarball of ``sources`` into a staging folder, one after
        another (call it outside the sliver lock); :meth:`commit` it under the lock, and
        :meth:`drop` it in any case. The rule is checked for all of them first."""
        wanted = list(dict.fromkeys(sources))
        for source in wanted:  # the rule first, for all of them: nothing fetched in vain
            problem = tarball_problem(source)
            if problem:
                raise _refuse(problem)
            if not is_url(source):
                raise _refuse(f"{source} cannot be found; local file does not exist (the "
                              "box's testbed server keeps no files)")
        staging = Staging(self.root / f".staging-{uuid.uuid4().hex}")
        try:
            for url in wanted:
                seconds = self.latency.fetch_seconds()  # fetchtar.proxy over ssh
                if seconds > 0:
                    time.sleep(seconds)
                staging.path.mkdir(parents=True, exist_ok=True)
                target = staging.path / stored_name(url)
                fetch(url, target, refused_waits=self.latency.refused_waits())
                staging.files[url] = target
                staging.md5[url] = _md5(target)  # here, not under the sliver lock
        except BaseException:
            self.drop(staging)
            raise
        if wanted:
            log.info("tarfiles: fetched %d URL(s) (not logged: they may be capabilities)",
                     len(wanted))
        return staging

    def commit(self, staging: Staging, slice_urn: str, held: Iterable[str]) -> None:
        """The staged copies become the sliver's (call under the sliver lock): a copy whose
        content changed replaces the kept one and is recorded as changed; kept copies of URLs
        in neither ``held`` (the URLs of the sliver's nodes now) nor the staging go."""
        into = self.sliver_dir(slice_urn)
        index = self._index(into)
        now = self.clock()
        for url, path in staging.files.items():
            name = stored_name(url)
            md5 = staging.md5[url]
            entry = index.get(name)
            into.mkdir(parents=True, exist_ok=True)
            if entry is None or entry["md5"] != md5 or not (into / name).exists():
                os.replace(path, into / name)
                index[name] = {"md5": md5, "changed_at": now, "fetched_at": now}
            else:
                entry["fetched_at"] = now
        keep = {stored_name(u) for u in held if is_url(u)} | {
            stored_name(u) for u in staging.files}
        for name in [n for n in index if n not in keep]:
            (into / name).unlink(missing_ok=True)
            del index[name]
        if index or into.exists():
            into.mkdir(parents=True, exist_ok=True)
            temporary = into / f".{self.INDEX}.{uuid.uuid4().hex}"
            temporary.write_text(json.dumps(index, sort_keys=True), encoding="utf-8")
            os.replace(temporary, into / self.INDEX)

    def drop(self, staging: Staging) -> None:
        shutil.rmtree(staging.path, ignore_errors=True)

    def discard(self, slice_urn: str) -> None:
        """The sliver is gone: so are its tarballs."""
        shutil.rmtree(self.sliver_dir(slice_urn), ignore_errors=True)

    def _index(self, into: Path) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads((into / self.INDEX).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as data:
        while chunk := data.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(url: str, target: Path, refused_waits: Sequence[float] = ()) -> None:
    """Download ``url`` to ``target`` (atomically), or BADARGS naming it. A refused
    connection is tried again after each of ``refused_waits`` (seconds)."""
    waits = list(refused_waits)
    while True:
        try:
            _fetch_once(url, target)
            return
        except _Refused as err:
            if not waits:
                raise _refuse(f"cannot fetch {url}: {err.reason}") from None
            time.sleep(waits.pop(0))


class _Refused(Exception):
    def __init__(self, reason: Any) -> None:
        super().__init__(str(reason))
        self.reason = reason


def _fetch_once(url: str, target: Path) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise _refuse(f"cannot fetch {url}: the box fetches over http and https only")
    if not _local_host(parts.hostname):
        raise _refuse(f"cannot fetch {url}: the box is offline (only hosts on this machine "
                      "answer)")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    size = 0
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT) as resp, open(partial, "wb") as out:
            while chunk := resp.read(CHUNK):
                size += len(chunk)
                if size > MAX_TARBALL_BYTES:
                    raise _refuse(f"{url} is larger than the box's limit of "
                                  f"{MAX_TARBALL_BYTES // (1024 * 1024)} MiB")
                out.write(chunk)
        os.replace(partial, target)
    except urllib.error.HTTPError as err:
        raise _refuse(f"cannot fetch {url}: HTTP {err.code} {err.reason}") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or getattr(err, "strerror", None) or err
        if isinstance(reason, ConnectionRefusedError) or isinstance(err, ConnectionRefusedError):
            raise _Refused(getattr(reason, "strerror", None) or reason) from None
        raise _refuse(f"cannot fetch {url}: {reason}") from None
    finally:
        partial.unlink(missing_ok=True)
