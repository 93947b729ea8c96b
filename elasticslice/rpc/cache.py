"""An on-disk credential cache: credentials kept until shortly before they expire.

Files live under ``<dir>/<owner>/<target>.xml`` (names made filesystem-safe), directories
mode 0700 and files 0600: a credential is a bearer token for its owner's certificate.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
from pathlib import Path

from elasticslice.errors import CredentialError

log = logging.getLogger(__name__)

DEFAULT_MARGIN = dt.timedelta(minutes=5)


def _expires_of(xml: str) -> dt.datetime:
    # imported when a credential is first read: the credential module needs lxml and
    # cryptography, which a command making no authenticated call does without
    from elasticslice.rpc.credential import expires_of
    return expires_of(xml)


def _safe(name: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-80:]
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{readable}-{digest}"


class CredentialCache:
    """Credentials by (owner URN, target URN); stale or unreadable entries are misses."""

    def __init__(self, directory: Path | None, margin: dt.timedelta = DEFAULT_MARGIN) -> None:
        self.directory = directory
        self.margin = margin
        self._memory: dict[tuple[str, str], tuple[str, dt.datetime]] = {}

    def _path(self, owner: str, target: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / _safe(owner) / f"{_safe(target)}.xml"

    def get(self, owner: str, target: str, now: dt.datetime | None = None) -> str | None:
        now = now or dt.datetime.now(dt.timezone.utc)
        hit = self._memory.get((owner, target))
        if hit is None:
            hit = self._load(owner, target)
        if hit is None:
            return None
        xml, expires = hit
        if expires - self.margin <= now:
            self.drop(owner, target)
            return None
        self._memory[(owner, target)] = hit
        return xml

    def _load(self, owner: str, target: str) -> tuple[str, dt.datetime] | None:
        path = self._path(owner, target)
        if path is None or not path.is_file():
            return None
        try:
            xml = path.read_text(encoding="utf-8")
            return xml, _expires_of(xml)
        except (OSError, UnicodeDecodeError, CredentialError) as err:
            log.warning("ignoring unreadable cached credential %s: %s", path, err)
            return None

    def put(self, owner: str, target: str, xml: str) -> None:
        try:
            expires = _expires_of(xml)
        except CredentialError as err:
            log.warning("not caching a credential for %s: %s", target, err)
            return
        self._memory[(owner, target)] = (xml, expires)
        path = self._path(owner, target)
        if path is None:
            return
        from elasticslice.rpc.pki import write_private_file
        try:
            for d in (path.parent.parent, path.parent):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(d, 0o700)
            tmp = path.with_suffix(".tmp")
            write_private_file(tmp, xml.encode("utf-8"))
            os.replace(tmp, path)
        except OSError as err:
            log.warning("cannot write credential cache %s: %s", path, err)

    def drop(self, owner: str, target: str) -> None:
        self._memory.pop((owner, target), None)
        path = self._path(owner, target)
        if path is not None:
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                log.warning("cannot remove cached credential %s: %s", path, err)
