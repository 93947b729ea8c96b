"""Certificates refused before they expire: a deny list by serial number.

A node's worker certificate is short-lived, but a node given back (or a certificate that was
taken from it) must be refused at once, not at its expiry. Whoever issues the certificates
(``elasticslice.pilots.enrol``) writes the serial numbers it revoked, each with its
certificate's expiry, to one JSON file; the scheduler's guard (and the enrolment service's
renewals) read it, again whenever it changed::

    {"serials": {"<serial, hex>": <expiry, epoch seconds>, ...}}

A serial leaves the file once its certificate expired (nothing accepts it then anyway).
The file holds no secret: serial numbers are in every certificate shown in a handshake.
A missing file denies nothing; a damaged one denies what it last read (one warning).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "TROY_TLS_DENY_FILE"   # a scheduler we start in its own process reads it there


def serial_of(peercert: dict | None) -> int | None:
    """The serial number of a certificate as ``SSLSocket.getpeercert()`` shows it."""
    text = (peercert or {}).get("serialNumber")
    try:
        return int(str(text), 16) if text else None
    except ValueError:
        return None


class DenyList:
    """The deny list in ``path``: :meth:`denied` reads it again when it changed, and
    :meth:`deny` (the issuer's side) adds serials to it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._serials: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"DenyList({str(self.path)!r})"

    def _read(self) -> dict[int, float]:
        """The file's serials (called with the lock held), read again if it changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._serials = None, {}
            return self._serials
        except OSError as err:
            log.warning("%s: cannot read the certificates' deny list: %s", self.path,
                        err.strerror or err)
            return self._serials
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                data = json.loads(self.path.read_text())
                self._serials = {int(str(k), 16): float(v)
                                 for k, v in dict(data.get("serials", {})).items()}
            except (OSError, ValueError, TypeError, AttributeError) as err:
                log.warning("%s: the certificates' deny list is damaged (%s): it denies "
                            "what it did before", self.path, err)
            self._stamp = stamp
        return self._serials

    def denied(self, serial: int | None, now: float | None = None) -> bool:
        """Whether the certificate with ``serial`` is refused."""
        if serial is None:
            return False
        with self._lock:
            until = self._read().get(serial)
        return until is not None and until > (time.time() if now is None else now)

    def version(self) -> tuple[int, int] | None:
        """What identifies the file's current contents (None: no file)."""
        with self._lock:
            self._read()
            return self._stamp

    def deny(self, serials: dict[int, float], now: float | None = None) -> None:
        """Add ``serials`` (serial -> its certificate's expiry) to the file; expired ones
        leave it."""
        now = time.time() if now is None else now
        with self._lock:
            current = dict(self._read())
            current.update(serials)
            kept = {s: until for s, until in current.items() if until > now}
            data = json.dumps({"serials": {format(s, "X"): until
                                           for s, until in sorted(kept.items())}})
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
            self._stamp = None
            self._serials = kept
