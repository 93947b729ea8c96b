"""The CM's tarfiles step: install tarballs fetched by the testbed, as CloudLab does it.

CreateSliver and AddNodes run it before they allocate anything (CloudLab runs
``tbsetup/tarfiles_setup`` after the mapper and rolls the allocation back when it fails: the
outcome is the same). Each tarball must pass the rule of :mod:`elasticslice.rspec.tarball`;
the CM fetches it itself (http or https, no proxy; the box is offline, so only hosts on this
machine answer), and keeps it as ``D/tarfiles/<sliver>/<md5 of the URL>.<ext>``. A URL
already kept for the sliver is not fetched again: a file changed behind the same URL is not
seen, as on CloudLab. Nodes install from the kept copy. A string that is not a URL is a path
on the testbed's server, and the box's server has no files. Any failure is BADARGS
``Could not setup tarfiles: ...`` naming the tarball.
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path

from elasticslice.emulator.geni import GeniFault
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


class TarfileStore:
    """The kept tarballs of every sliver, under ``D/tarfiles``."""

    def __init__(self, directory: Path) -> None:
        self.root = directory / "tarfiles"

    def sliver_dir(self, sliver_urn: str) -> Path:
        digest = hashlib.sha256(sliver_urn.encode("utf-8")).hexdigest()[:24]
        return self.root / digest

    def kept(self, sliver_urn: str, url: str) -> Path:
        """Where the sliver's copy of ``url`` is (it may not exist)."""
        return self.sliver_dir(sliver_urn) / stored_name(url)

    # ---- the step
    def stage(self, sources: Iterable[str]) -> Path:
        """Fetch every tarball of a new sliver into a staging folder (CreateSliver, before
        the sliver exists); :meth:`adopt` or :meth:`drop` it after."""
        staging = self.root / f".staging-{uuid.uuid4().hex}"
        try:
            self._setup(sources, staging)
        except BaseException:
            self.drop(staging)
            raise
        return staging

    def adopt(self, staging: Path, sliver_urn: str) -> None:
        """The staged tarballs become the sliver's."""
        target = self.sliver_dir(sliver_urn)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        if staging.exists():
            os.replace(staging, target)

    def drop(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def add(self, sliver_urn: str, sources: Iterable[str]) -> None:
        """AddNodes: fetch what the sliver does not keep yet."""
        self._setup(sources, self.sliver_dir(sliver_urn))

    def discard(self, sliver_urn: str) -> None:
        """The sliver is gone: so are its tarballs."""
        shutil.rmtree(self.sliver_dir(sliver_urn), ignore_errors=True)

    def _setup(self, sources: Iterable[str], into: Path) -> None:
        wanted = list(dict.fromkeys(sources))
        for source in wanted:  # the rule first, for all of them: nothing fetched in vain
            problem = tarball_problem(source)
            if problem:
                raise _refuse(problem)
            if not is_url(source):
                raise _refuse(f"{source} cannot be found; local file does not exist (the "
                              "box's testbed server keeps no files)")
        for url in wanted:
            target = into / stored_name(url)
            if target.exists():
                continue  # once per sliver: the same URL is not fetched again
            into.mkdir(parents=True, exist_ok=True)
            fetch(url, target)
            log.info("tarfiles: fetched %s (its URL is not logged: it may be a capability)",
                     target.name)


def fetch(url: str, target: Path) -> None:
    """Download ``url`` to ``target`` (atomically), or BADARGS naming it."""
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
        raise _refuse(f"cannot fetch {url}: {reason}") from None
    finally:
        partial.unlink(missing_ok=True)
