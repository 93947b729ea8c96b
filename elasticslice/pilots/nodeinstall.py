"""The node's installer: builds the agent's environment from the control node's wheelhouse.

Run by the image's ``python3`` from the lines :func:`~elasticslice.pilots.bootstrap.env_script`
returns, as ``python3 - LAYOUT MODE URL TARGET WAIT [INDEX_URL]`` with this module's source
(after :mod:`~elasticslice.pilots.wheeltags`', embedded) on standard input:

- ``LAYOUT`` ``root``: ``URL`` is a wheelhouse root, and the node asks for the wheelhouse
  that fits it, ``URL/<cpXY-manylinux_2_N_MACHINE>/``; the control node answers 503 with
  ``Retry-After`` while it builds it (the installer waits up to ``WAIT`` seconds, with a
  line now and then) and 404 with its reason when it cannot (one line naming the node's
  Python and machine and that reason). A 404 without a reason where ``URL`` is one
  wheelhouse (``URL/wheels.txt``: a control node that publishes a single one) takes that
  one, whose wheels are then checked as any. ``house``: ``URL`` is one wheelhouse.
- ``MODE`` ``wheels``: every wheel from the wheelhouse; ``index``: the pins from the package
  index (``INDEX_URL``, default pip's; a relative one is the wheelhouse's, e.g. ``simple/``)
  with pip run from the wheelhouse's own pip wheel, the project's wheel from the wheelhouse.

With ``ELASTICSLICE_WHEELHOUSE_CA`` (:data:`CA_ENV`: the cluster CA's certificate, PEM) in
its environment, an ``https`` wheelhouse is verified against that CA alone: its server must
show a certificate the CA signed for the URL's host, of the role ``control`` (a node's
certificate, OU ``worker``, is refused), else the installer ends at once with one line naming
what failed verification (``wheels.txt from the wheelhouse at https://HOST:PORT/... failed
verification: ...``). ``wheels.txt`` so comes from the control node itself, and it pins
every wheel's sha256 and size: an on-path attacker can swap neither the list nor a wheel.

First, with no network: an environment already at ``TARGET`` whose stamp (written last,
JSON) names this Python, with its ``bin/python3`` and ``site-packages``, is complete and is
used as it is (a reboot; a stamp naming a wheelhouse the control node no longer serves too).
Anything else there that is ours (``pyvenv.cfg``) is a build that did not finish: removed and
built again. Every wheel's tags are checked against the node (:func:`wheel_problem`) before
anything is fetched or unpacked. Nothing needs root or a writable HOME (pip runs with
``--no-cache-dir``). Whatever fails is one line on stderr and exit status 1; the URL's path
(the publisher's unguessable prefix) is never printed.

Standard library only, and it parses on Python 3.6 (to say "too old" on an old image).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

from elasticslice.pilots.nodefetch import Answer, Failed, get, pin, where
from elasticslice.pilots.wheeltags import (MIN_PYTHON, describe, glibc_version, machine,
                                           node_tag, this_platform, wheel_problem)

STAMP_NAME = ".elasticslice-env"
#: the cluster CA's certificate (PEM), in the installer's environment: an https wheelhouse
#: must show a certificate of the control node (OU ``control``) that this CA signed
CA_ENV = "ELASTICSLICE_WHEELHOUSE_CA"
NOTE_EVERY = 60.0  # seconds between two "waiting" lines
RETRY_AFTER = 5.0  # a 503 without Retry-After
Entry = Tuple[str, int, str]  # sha256, size, file name


class Installer:
    def __init__(self, argv: List[str]) -> None:
        self.layout, self.mode, self.base, self.target = argv[1], argv[2], argv[3], argv[4]
        self.wait = float(argv[5])
        self.index_url = argv[6] if len(argv) > 6 else ""
        self.ca = os.environ.get(CA_ENV) or ""
        if self.ca:
            pin(self.ca)
        self.stamp = os.path.join(self.target, STAMP_NAME)
        self.python = tuple(sys.version_info[:2])  # type: Tuple[int, int]
        self.version = "%d.%d" % self.python
        self.node = (self.python, machine(), glibc_version())
        self.house = self.base.rstrip("/") + "/"
        if self.layout == "root":
            self.house += node_tag(self.python, this_platform()) + "/"
        self.started = time.time()

    # ------------------------------------------------------------------ what is there --
    def complete(self) -> bool:
        """The environment at the target is complete for this Python (no network)."""
        try:
            with open(self.stamp) as handle:
                raw = handle.read().strip()
            info = json.loads(raw) if raw.startswith("{") else {}  # before: a digest line
        except (OSError, ValueError):
            return False
        if not raw or not isinstance(info, dict) or info.get("python", self.version) \
                != self.version:
            return False
        site = os.path.join(self.target, "lib", "python" + self.version, "site-packages")
        return os.access(os.path.join(self.target, "bin", "python3"), os.X_OK) and \
            os.path.isdir(site)

    # ---------------------------------------------------------------- the wheelhouse --
    def fetch(self, name: str, tries: int = 3) -> bytes:
        url = self.house + name
        for attempt in range(tries):
            try:
                return get(url)
            except (Answer, OSError) as err:
                code = getattr(err, "code", None)
                if (code is not None and code < 500) or attempt == tries - 1:
                    why = ("HTTP %d" % code) if code else str(getattr(err, "reason", err))
                    raise Failed("cannot fetch %s from the wheelhouse at %s: %s"
                                 % (name, where(url), why)) from None
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    def wheels_txt(self) -> str:
        """``wheels.txt`` of the node's wheelhouse; with a root, waits while it is built."""
        if self.layout != "root":
            return self.fetch("wheels.txt").decode()
        about = "%s on %s" % (self.version, self.node[1])
        deadline, noted, errors = time.time() + self.wait, None, 0
        while True:
            try:
                return get(self.house + "wheels.txt").decode()
            except Answer as answer:
                if answer.code == 404 and answer.reason == "HTTP 404" and \
                        self.house != self.base.rstrip("/") + "/" and self.one_wheelhouse():
                    return self.fetch("wheels.txt").decode()
                if answer.code == 404:
                    raise Failed("the control node has no wheelhouse for Python %s: %s"
                                 % (about, answer.reason)) from None
                now = time.time()
                if answer.code == 503:
                    if now >= deadline:
                        raise Failed("the control node's wheelhouse for Python %s was not "
                                     "ready within %d s: %s" % (about, self.wait,
                                                                answer.reason)) from None
                    if noted is None or now - noted >= NOTE_EVERY:
                        print("pilot environment: waiting for the control node's wheelhouse "
                              "for Python %s (%d s so far): %s"
                              % (about, now - self.started, answer.reason), flush=True)
                        noted = now
                    time.sleep(max(1.0, min(answer.retry_after or RETRY_AFTER, 30.0,
                                            deadline - now)))
                    continue
                errors += 1
                if answer.code < 500 or errors >= 3:
                    raise Failed("cannot fetch wheels.txt from the wheelhouse at %s: HTTP %d"
                                 % (where(self.house), answer.code)) from None
            except OSError as err:
                errors += 1
                if errors >= 3:
                    raise Failed("cannot fetch wheels.txt from the wheelhouse at %s: %s"
                                 % (where(self.house), getattr(err, "reason", err))) from None
            time.sleep(0.5 * errors)

    def one_wheelhouse(self) -> bool:
        """A 404 without a reason for the node's name: whether the URL is one wheelhouse
        (a control node that publishes a single one); if so, it is the node's."""
        try:
            get(self.base.rstrip("/") + "/wheels.txt")
        except (Answer, OSError):
            return False
        self.house = self.base.rstrip("/") + "/"
        return True

    def manifest(self) -> Tuple[str, List[Entry], Dict[str, Entry]]:
        text = self.wheels_txt()
        lines = text.splitlines()
        head = lines[0].split() if lines else []
        if len(head) < 3 or head[:2] != ["#", "python"]:
            raise Failed("the wheelhouse at %s has no wheels.txt header" % where(self.house))
        if head[2] != self.version:
            raise Failed("the wheelhouse is for Python %s, this node's %s is %s: build one "
                         "for %s (Wheelhouse.for_python(%r))" % (head[2], sys.executable,
                                                                 self.version, self.version,
                                                                 self.version))
        wheels, tools = [], {}  # type: List[Entry], Dict[str, Entry]
        for line in lines[1:]:
            words = line.split()
            if len(words) == 4 and words[0] == "#tool":
                tools[os.path.basename(words[3]).split("-")[0]] = (words[1], int(words[2]),
                                                                   words[3])
            elif len(words) == 3 and not line.startswith("#"):
                wheels.append((words[0], int(words[1]), words[2]))
        return text, wheels, tools

    def check_fits(self, entries: List[Entry]) -> None:
        """Every wheel fits this node, or one line naming the first that does not."""
        for _, _, name in entries:
            problem = wheel_problem(os.path.basename(name), *self.node)
            if problem:
                raise Failed("%s does not fit this node (%s): %s"
                             % (os.path.basename(name), describe(*self.node), problem))

    def checked(self, entry: Entry) -> bytes:
        digest, size, name = entry
        data = self.fetch(name)
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise Failed("%s from the wheelhouse at %s does not match its sha256"
                         % (name, where(self.house)))
        return data

    # --------------------------------------------------------------- the environment --
    def make_venv(self) -> Tuple[str, str]:
        target = self.target
        if os.path.lexists(target):  # a build that did not finish: only ever one of ours
            if os.path.islink(target) or not os.path.isdir(target) or (
                    os.listdir(target) and not os.path.exists(os.path.join(target,
                                                                           "pyvenv.cfg"))):
                raise Failed("%s exists and is not an environment of ours" % target)
            shutil.rmtree(target)
        import venv
        venv.EnvBuilder(symlinks=True, with_pip=False).create(target)
        python = os.path.join(target, "bin", "python3")
        if not os.path.exists(python):
            os.symlink(sys.executable, python)
        site = os.path.join(target, "lib", "python" + self.version, "site-packages")
        if not os.path.isdir(site):
            raise Failed("venv made no %s" % site)
        return python, site

    def install(self, data: bytes, name: str, site: str, python: str) -> None:
        """PEP 427: unpack, .data/ to its scheme's folder, console scripts from entry
        points."""
        prefix = self.target
        schemes = {"purelib": site, "platlib": site, "scripts": os.path.join(prefix, "bin"),
                   "data": prefix,
                   "headers": os.path.join(prefix, "include", "site", "python" + self.version)}
        dist_info = None
        with zipfile.ZipFile(io.BytesIO(data)) as wheel:
            for info in wheel.infolist():
                member = info.filename
                if member.endswith("/"):
                    continue
                top, _, rest = member.partition("/")
                if top.endswith(".dist-info"):
                    dist_info = top
                if top.endswith(".data") and rest:
                    scheme, _, rest = rest.partition("/")
                    if scheme not in schemes or not rest:
                        raise Failed("%s: unknown .data scheme %r" % (name, scheme))
                    dest = safe(schemes[scheme], rest)
                else:
                    scheme, dest = "", safe(site, member)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                body = wheel.read(info)
                mode = (info.external_attr >> 16) & 0o777
                if scheme == "scripts":
                    body = re.sub(rb"^#!python\w*", b"#!" + python.encode(), body, count=1)
                    mode = 0o755
                with open(dest, "wb") as out:
                    out.write(body)
                if mode & 0o111:
                    os.chmod(dest, 0o755)
        if dist_info is None:
            raise Failed("%s: no .dist-info" % name)
        with open(os.path.join(site, dist_info, "INSTALLER"), "w") as out:
            out.write("elasticslice-bootstrap\n")
        scripts(os.path.join(site, dist_info, "entry_points.txt"),
                os.path.join(prefix, "bin"), python)

    def from_index(self, wheels: List[Entry], tools: Dict[str, Entry], python: str) -> None:
        if "pip" not in tools:
            raise Failed("the wheelhouse at %s has no pip for index mode" % where(self.house))
        work = os.path.join(self.target, ".bootstrap")
        os.makedirs(work, exist_ok=True)
        pip = os.path.join(work, os.path.basename(tools["pip"][2]))
        with open(pip, "wb") as out:
            out.write(self.checked(tools["pip"]))
        reqs = os.path.join(work, "requirements.txt")
        with open(reqs, "wb") as out:
            out.write(self.fetch("requirements.txt"))
        project = [w for w in wheels if w[2].split("-")[0] == "elasticslice"]
        if not project:
            raise Failed("the wheelhouse at %s has no elasticslice wheel" % where(self.house))
        local = os.path.join(work, project[0][2])
        with open(local, "wb") as out:
            out.write(self.checked(project[0]))
        env = dict(os.environ)
        # no cache: startup commands run as the experiment's user with root's HOME
        # --no-compile: as the wheels' own install, the agent compiles what it imports
        # (pip's compiling of all 25 was about 4 s of its 9: the module docstring of
        # elasticslice.pilots.bootstrap)
        cmd = [python, os.path.join(pip, "pip"), "install", "--quiet", "--no-deps",
               "--no-cache-dir", "--no-compile", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "-r", reqs, local]
        index_url = urllib.parse.urljoin(self.house, self.index_url) if self.index_url else ""
        if index_url:
            cmd[3:3] = ["--index-url", index_url]
            env["PIP_CONFIG_FILE"] = os.devnull
            index = urllib.parse.urlsplit(index_url)
            own = index.netloc == urllib.parse.urlsplit(self.house).netloc
            if index.scheme == "http" and own:
                # the wheelhouse's own index (its links carry each wheel's sha256, which pip
                # checks): pip ignores plain HTTP from any host but loopback unless trusted
                cmd[3:3] = ["--trusted-host", index.netloc]
            elif index.scheme == "https" and own and self.ca:
                cafile = os.path.join(work, "ca.pem")  # pip verifies it as this does
                with open(cafile, "w") as out:
                    out.write(self.ca)
                cmd[3:3] = ["--cert", cafile]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if x.strip()]
            raise Failed("pip could not install the pins from the package index: %s"
                         % (lines[-1] if lines else "exit status %d" % done.returncode))
        shutil.rmtree(work, ignore_errors=True)

    def run(self) -> None:
        if self.complete():
            print("pilot environment: %s is complete" % self.target)
            return
        if self.python < MIN_PYTHON:
            raise Failed("this node's %s is Python %s; the node agent needs Python %d.%d or "
                         "later" % ((sys.executable, self.version) + MIN_PYTHON))
        text, wheels, tools = self.manifest()
        self.check_fits(wheels if self.mode == "wheels" else
                        [w for w in wheels if w[2].split("-")[0] == "elasticslice"]
                        + list(tools.values()))
        python, site = self.make_venv()
        if self.mode == "wheels":
            # fetched in parallel, unpacked one at a time here: unpacking is CPU and threads
            # contending for it cost more than they save (on a busy node, twice the CPU)
            with ThreadPoolExecutor(4) as pool:
                for entry, data in zip(wheels, pool.map(self.checked, wheels)):
                    self.install(data, entry[2], site, python)
        else:
            self.from_index(wheels, tools, python)
        with open(self.stamp + ".tmp", "w") as out:
            json.dump({"python": self.version, "mode": self.mode,
                       "wheelhouse": hashlib.sha256(text.encode()).hexdigest(),
                       "built": int(time.time())}, out)
            out.write("\n")
        os.replace(self.stamp + ".tmp", self.stamp)
        print("pilot environment: built in %s in %.1f s (%d wheels%s)"
              % (self.target, time.time() - self.started, len(wheels),
                 ", pins from the index" if self.mode == "index" else ""))


def safe(root: str, name: str) -> str:
    path = os.path.normpath(os.path.join(root, name))
    if os.path.isabs(name) or name.startswith("..") or not (
            path == root or path.startswith(root.rstrip("/") + "/")):
        raise Failed("a wheel holds a path outside its folder: %s" % name)
    return path


def scripts(entry_points: str, bindir: str, python: str) -> None:
    """Console scripts from a wheel's ``entry_points.txt``."""
    if not os.path.exists(entry_points):
        return
    section = None
    with open(entry_points) as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif "=" in line and section in ("console_scripts", "gui_scripts"):
                script, _, ref = (p.strip() for p in line.partition("="))
                module, _, attr = ref.partition(":")
                path = os.path.join(bindir, script)
                attr = attr.split("[")[0].strip()
                with open(path, "w") as out:
                    out.write("#!%s\nimport sys\nfrom %s import %s\nif __name__ == "
                              "'__main__':\n    sys.exit(%s())\n"
                              % (python, module.strip(), attr.split(".")[0], attr))
                os.chmod(path, 0o755)


def main(argv: List[str]) -> int:
    target = argv[4] if len(argv) > 4 else "?"
    try:
        Installer(argv).run()
    except Failed as err:
        sys.stderr.write("pilot environment: %s\n" % err)
        return 1
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        sys.stderr.write("pilot environment: cannot build %s: %s: %s\n"
                         % (target, type(err).__name__, err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
