"""The tarball rule: which install tarballs CloudLab takes, and what it calls them.

Source: Emulab's ``tbsetup/tarfiles_setup``, which GeniCM.pm runs in CreateSliver and
AddNodes after the mapper. It accepts a tarball given as a URL only when the URL matches
``^(http|https|ftp)://[\\w.\\-/@:~]+(\\.tar|\\.tar\\.Z|\\.tar\\.gz|\\.tgz|\\.bz2|\\.rpm)$``
(so no query string, no ``file://``); it fetches the URL itself, on the testbed's server,
and keeps it as ``<md5 of the URL>.<ext>`` with the experiment. Any other string is a path on
the testbed's server, which must exist there. A URL that fails the rule or the fetch fails the
whole call with BADARGS ``Could not setup tarfiles: ...`` and nothing is allocated
(:data:`SETUP_FAILED`). CM v2 AddNodes takes tarballs as URL strings and installs each at
``/`` (GeniCMV2.pm: ``<install url='$tarball' install_path='/'/>``).

One rule, used by the emulator's CM, ``elasticslice rspec validate``, the manager config's
``tarballs`` key and the client's AddNodes arguments: :func:`tarball_problem`.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

RULE_SOURCE = "Emulab tbsetup/tarfiles_setup, run by GeniCM.pm CreateSliver/AddNodes"
URL_RULE = re.compile(r"^(http|https|ftp)://[\w.\-/@:~]+(\.tar|\.tar\.Z|\.tar\.gz|\.tgz|\.bz2"
                      r"|\.rpm)$", re.ASCII)
# a path on the testbed's server (CloudLab: it must exist there; the box has none)
SERVER_PATH = re.compile(r"^/[\w.\-/@:~+]+$", re.ASCII)
SETUP_FAILED = "Could not setup tarfiles"
ADDNODES_INSTALL_PATH = "/"
MAX_SOURCE = 1024
WANT = ("http://, https:// or ftp:// ending in .tar, .tar.Z, .tar.gz, .tgz, .bz2 or .rpm, with "
        "only letters, digits and . - / @ : ~ _ (no query string)")


def _shown(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def is_url(source: str) -> bool:
    """Whether ``source`` is a URL CloudLab fetches (else it is a testbed path, or bad)."""
    return len(source) <= MAX_SOURCE and URL_RULE.fullmatch(source) is not None


def tarball_problem(source: Any) -> str | None:
    """None when CloudLab takes ``source`` (a URL it fetches, or a path on its server),
    else one line saying why not."""
    if not isinstance(source, str) or not source:
        return f"tarball {_shown(source)!r} is not a URL"
    if len(source) > MAX_SOURCE:
        return f"tarball URL {_shown(source)!r} is longer than {MAX_SOURCE} characters"
    if is_url(source):
        return None
    if "://" not in source:
        if SERVER_PATH.fullmatch(source) and "/../" not in source + "/":
            return None
        return (f"tarball {_shown(source)!r} is neither a URL ({WANT}) nor an absolute path on "
                "the testbed's server")
    scheme = source.split("://", 1)[0].lower()
    if scheme == "file":
        return (f"tarball {_shown(source)!r}: file:// URLs are refused (the testbed fetches "
                "each tarball itself, over http(s) or ftp)")
    if "?" in source or "#" in source:
        return f"tarball URL {_shown(source)!r} has a query string or fragment (refused)"
    return f"tarball URL {_shown(source)!r} does not match the rule: want {WANT}"


def extension(url: str) -> str:
    """The tarball extension the rule matched (``tar.gz``, ``tgz``...), without the dot."""
    match = URL_RULE.fullmatch(url)
    if match is None:
        raise ValueError(f"not a tarball URL: {_shown(url)!r}")
    return match.group(2)[1:]


def stored_name(url: str) -> str:
    """What the testbed calls its copy of ``url``: ``<md5 of the URL>.<ext>``."""
    return f"{hashlib.md5(url.encode('utf-8'), usedforsecurity=False).hexdigest()}.{extension(url)}"


def setup_failed(detail: str) -> str:
    """The CM's answer when a tarball cannot be set up (BADARGS)."""
    return f"{SETUP_FAILED}: {detail}"
