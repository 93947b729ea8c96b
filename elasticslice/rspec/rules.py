"""Rules a request keeps beyond the GENI schema: one rule for node client_ids, everywhere.

A node's client_id names the node in ``AddNodes`` and ``DeleteNodes``, in hostnames
(``<client_id>.<slice>.<project>.<domain>``) and on disk; so it must be 1-64 letters,
digits, ``-``, ``_`` or ``.``, starting with a letter or digit (never ``..`` or ``/``), and
unique in the request. ``AddNodes`` (:func:`~elasticslice.rspec.addnodes.nodespecs_from_add_args`),
``CreateSliver`` at the emulator, ``elasticslice rspec validate`` and the client's
``create-sliver`` check all apply :func:`client_id_problem`.

A node's disk image (``disk_image@name``, ``AddNodes``' ``diskimage``) is an image URN,
``urn:publicid:IDN+<authority>+image+<name>``, e.g.
``urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD``: CloudLab refuses anything
else (such as the placeholder ``URN``). :func:`image_problem` is that rule, applied where
client_ids are checked, and by ``rspec build``.

A node's execute services are held to CloudLab's CM's rules (``protogeni/lib/GeniCM.pm.in``):
no empty command; one execute (an RSpec node's, or AddNodes' ``startup``) passes
``TBcheck_dbslot(cmd, "virt_nodes", "startupcmd")`` (:func:`startup_problem`); several must
each name the shell sh or csh (:func:`executes_problem`).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from elasticslice.rspec.model import RSpec, RSpecType

# A node runs its startup command as one argument of ``sh -c``: Linux refuses an argument over
# 128 KiB (MAX_ARG_STRLEN), so the node would fail to boot. Half that leaves room.
MAX_COMMAND_BYTES = 65536
CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
CLIENT_ID_RULE = "client_id must be 1-64 letters, digits, '-', '_' or '.'"
# urn:publicid:IDN+<authority>[:<sub-authority>...]+image+<name>; the name is
# <project>//<image> (today's form), <project>:<image> (the older one) or a bare image name,
# optionally followed by :<version>. GENI URNs compare the prefix without regard to case.
IMAGE_URN = re.compile(
    r"^urn:publicid:IDN\+[A-Za-z0-9][A-Za-z0-9.\-]*(?::[A-Za-z0-9][A-Za-z0-9._\-]*)*"
    r"\+image\+[A-Za-z0-9][A-Za-z0-9._\-]*(?:(?://|:)[A-Za-z0-9][A-Za-z0-9._\-]*)*$",
    re.IGNORECASE)
MAX_IMAGE_URN = 512
IMAGE_URN_RULE = ("not an image URN (want urn:publicid:IDN+<authority>+image+<project>//<name>"
                  ", e.g. urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD)")


def shown(value: Any, limit: int = 32) -> str:
    """A client_id as quoted in a message: at most ``limit`` characters (a hostile id must
    not flood the answer)."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def client_id_problem(cid: Any) -> str | None:
    """None for a valid node client_id, else what is wrong with it (one line)."""
    if isinstance(cid, str) and CLIENT_ID.fullmatch(cid):
        return None
    if cid is None or cid == "":
        return "a node has no client_id"
    return f"node client_id {shown(cid)!r}: {CLIENT_ID_RULE}"


def client_id_problems(cids: Iterable[tuple[Any, int]]) -> list[tuple[int, str]]:
    """``(line, problem)`` for every bad or repeated client_id of ``(client_id, line)``."""
    seen: set[str] = set()
    out = []
    for cid, line in cids:
        problem = client_id_problem(cid)
        if problem is None and cid in seen:
            problem = f"node client_id {shown(cid)!r} given twice"
        if problem:
            out.append((line, problem))
        seen.add(cid)
    return out


def image_problem(image: Any, node: Any = None) -> str | None:
    """None for a well-formed image URN, else one line naming the node (when given) and the
    value."""
    if isinstance(image, str) and len(image) <= MAX_IMAGE_URN and IMAGE_URN.fullmatch(image):
        return None
    where = f"node {shown(node)}: " if node is not None else ""
    return f"{where}disk image {shown(image, 80)!r} is {IMAGE_URN_RULE}"


def _is_url(image: str) -> bool:
    """A ``disk_image@url`` (CloudLab takes an image by URL too); the parser reads ``url``
    where there is no ``name``, so a parsed request holds either."""
    return image.startswith(("https://", "http://"))


def command_problem(command: str) -> str | None:
    """Why a node could not run ``command`` at boot (None: it could)."""
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        return f"the command is {size} bytes, more than the limit of {MAX_COMMAND_BYTES}"
    if "\0" in command:
        return "the command contains a NUL character"
    return None


# R7: GeniCM.pm.in checks a single startup command with TBcheck_dbslot($cmd, "virt_nodes",
# "startupcmd") (db/emutil.pm.in), which sql/database-fill.sql redirects to html_tinytext:
# regex ^[\040-\176]*$ (printable ASCII) and at most 256 characters. The column is a MySQL
# tinytext (255 bytes): the box keeps the stricter 255. Perl's ``$`` would let one trailing
# newline through the regex; the box refuses every newline (stricter).
STARTUP_CHARS = re.compile(r"[\x20-\x7e]*")
MAX_STARTUP = 255
# R6: GeniCM.pm.in, several execute services: "Support only sh and csh".
EXECUTE_SHELLS = frozenset({"sh", "csh", "/bin/sh", "/bin/csh"})


def startup_problem(command: str) -> str | None:
    """Why CloudLab's CM refuses ``command`` as a node's one startup command (None: it
    takes it): TBcheck_dbslot's "Illegal Characters" or "Too Long"."""
    if not STARTUP_CHARS.fullmatch(command):
        at = next(i for i, ch in enumerate(command) if not " " <= ch <= "~")
        return (f"Invalid startup command: Illegal Characters ({command[at]!r} at character "
                f"{at + 1}: only printable ASCII, no newline or tab)")
    if len(command) > MAX_STARTUP:
        return (f"Invalid startup command: Too Long ({len(command)} characters; at most "
                f"{MAX_STARTUP})")
    return None


def executes_problem(executes: Iterable[tuple[str, str]]) -> str | None:
    """Why CloudLab's CM refuses a node's execute services (GeniCM.pm.in): an empty command;
    one execute whose command fails :func:`startup_problem`; several, one of whose shells is
    not sh or csh. None: it takes them."""
    pairs = list(executes)
    if any(not command for _, command in pairs):
        return "Invalid service command: no command provided"
    if len(pairs) == 1:
        return startup_problem(pairs[0][1])
    for shell, _ in pairs:
        if shell not in EXECUTE_SHELLS:
            return (f"Invalid shell in execute ({shown(shell)!r}: with several execute "
                    "services only sh, csh, /bin/sh or /bin/csh)")
    return None


def request_problem(rspec: RSpec) -> str | None:
    """The first node client_id of a request that breaks the rule, the first disk image that
    is not an image URN, or the first node execute a node could not run or CloudLab's CM
    refuses (:func:`executes_problem`; None: all good, or not a request). The emulator's
    CreateSliver answers it with BADARGS."""
    if rspec.type is not RSpecType.REQUEST:
        return None
    problems = client_id_problems((node.client_id, 0) for node in rspec.nodes)
    if problems:
        return problems[0][1]
    for node in rspec.nodes:
        if node.disk_image is not None and not _is_url(node.disk_image):
            problem = image_problem(node.disk_image, node.client_id)
            if problem:
                return problem
        for _, command in node.executes:
            problem = command_problem(command)
            if problem:
                return f"node {shown(node.client_id)}: execute: {problem}"
        problem = executes_problem(node.executes)
        if problem:
            return f"node {shown(node.client_id)}: {problem}"
    return None
