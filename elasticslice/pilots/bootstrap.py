"""The node agent's environment on a stock image, built by the node's start script.

:func:`env_script` returns POSIX ``sh`` lines for ``start.sh``: with the image's ``python3``
they make a virtual environment under ``/local/pilot/env`` (``venv`` without pip: only the
standard library is needed, Debian's and Ubuntu's python3 included, which lack ensurepip)
and install into it every wheel of the control node's wheelhouse
(:mod:`elasticslice.pilots.wheelhouse`), then set the shell variable ``py`` to its Python::

    "$py" -m troy.frameworks.dask node ...

Installing is a small stdlib program (embedded in the lines) that does what PEP 427 says a
wheel install is: fetch ``wheels.txt`` (each wheel's sha256 and size), fetch the wheels
in parallel, check each digest, unzip each into ``site-packages`` (``.data/`` to its
scheme's folder, console scripts made from ``entry_points.txt``). No dependency resolution
is needed (the wheelhouse *is* the resolved set) and nothing is byte-compiled ahead (the
agent compiles what it imports, once). Measured on the box's stock image (2 cores, 25
wheels, 13 MB): this takes about 1.3 s where ``pip install --no-index --find-links``
takes about 9 s (and 5 s with ``--no-compile``) and needs pip on the image, which a stock
Ubuntu may not have (``bench/bench_join.py``).

With ``index=True`` the third-party wheels come from the package index instead, pinned to
the same versions (``requirements.txt`` of the wheelhouse; ``--only-binary=:all:
--no-deps``), installed by pip run from the wheelhouse's own pip wheel (``python
pip.whl/pip``; the image needs no pip), and only the project's wheel from the wheelhouse.

A second run on the same node (a reboot re-runs the startup command) finds the
environment complete (a stamp with the digest of the wheelhouse's ``wheels.txt``, written
last) and only sets ``py``; a partial one (a build interrupted) is removed and built again.
Whatever is missing (no ``python3``, a wheelhouse that cannot be fetched, a wheel whose
digest differs, a wheelhouse for another Python) ends the script with one line on stderr
and exit status 1; the wheelhouse's path is not printed (the publisher's URLs are
unguessable), only its scheme, host and port.

``env_script(None, python=...)`` is for an image that already has the agent (the box's
``ELASTICSLICE-PILOT``, a custom CloudLab image: ``node_python``): just ``py=...``.
"""
from __future__ import annotations

import shlex

DEFAULT_TARGET = "/local/pilot/env"
STAMP = ".elasticslice-env"

# The installer, run by the image's python3 (stdlib only, Python 3.6+):
#   python3 - MODE URL TARGET [INDEX_URL]      MODE: wheels | index
INSTALLER = r'''
import hashlib, io, json, os, re, shutil, subprocess, sys, time, zipfile
import urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor

mode, base, target = sys.argv[1], sys.argv[2].rstrip("/") + "/", sys.argv[3]
index_url = sys.argv[4] if len(sys.argv) > 4 else ""
STAMP = os.path.join(target, "@STAMP@")
started = time.time()


class Failed(Exception):
    pass


def where(url):
    parts = urllib.parse.urlsplit(url)
    return "%s://%s/..." % (parts.scheme, parts.netloc)


def fetch(name, tries=3):
    url = base + name
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=60) as answer:
                return answer.read()
        except Exception as err:  # noqa
            code = getattr(err, "code", None)
            if (code is not None and code < 500) or attempt == tries - 1:
                why = ("HTTP %d" % code) if code else str(getattr(err, "reason", err))
                raise Failed("cannot fetch %s from the wheelhouse at %s: %s"
                             % (name, where(url), why))
            time.sleep(0.5 * (attempt + 1))


def manifest():
    text = fetch("wheels.txt").decode()
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) < 3 or head[:2] != ["#", "python"]:
        raise Failed("the wheelhouse at %s has no wheels.txt header" % where(base))
    mine = "%d.%d" % sys.version_info[:2]
    if head[2] != mine:
        raise Failed("the wheelhouse is for Python %s, this node's %s is %s: build one for "
                     "%s (Wheelhouse.for_python(%r))" % (head[2], sys.executable, mine, mine,
                                                         mine))
    wheels, tools = [], {}
    for line in lines[1:]:
        words = line.split()
        if len(words) == 4 and words[0] == "#tool":
            tools[os.path.basename(words[3]).split("-")[0]] = (words[1], int(words[2]),
                                                               words[3])
        elif len(words) == 3 and not line.startswith("#"):
            wheels.append((words[0], int(words[1]), words[2]))
    return text, wheels, tools


def complete(digest):
    try:
        with open(STAMP) as handle:
            return handle.read().strip() == digest and os.path.exists(
                os.path.join(target, "bin", "python3"))
    except OSError:
        return False


def make_venv():
    if os.path.lexists(target):  # a build that did not finish: only ever one of ours
        if os.path.islink(target) or not os.path.isdir(target) or (
                os.listdir(target) and not os.path.exists(os.path.join(target, "pyvenv.cfg"))):
            raise Failed("%s exists and is not an environment of ours" % target)
        shutil.rmtree(target)
    import venv
    venv.EnvBuilder(symlinks=True, with_pip=False).create(target)
    python = os.path.join(target, "bin", "python3")
    if not os.path.exists(python):
        os.symlink(sys.executable, python)
    ver = "python%d.%d" % sys.version_info[:2]
    site = os.path.join(target, "lib", ver, "site-packages")
    if not os.path.isdir(site):
        raise Failed("venv made no %s" % site)
    return python, site


def safe(root, name):
    path = os.path.normpath(os.path.join(root, name))
    if os.path.isabs(name) or name.startswith("..") or not (
            path == root or path.startswith(root.rstrip("/") + "/")):
        raise Failed("a wheel holds a path outside its folder: %s" % name)
    return path


def install(data, name, site, python):
    """PEP 427: unpack, .data/ to its scheme's folder, console scripts from entry points."""
    prefix = target
    ver = "python%d.%d" % sys.version_info[:2]
    schemes = {"purelib": site, "platlib": site, "scripts": os.path.join(prefix, "bin"),
               "data": prefix, "headers": os.path.join(prefix, "include", "site", ver)}
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
                scheme, dest = None, safe(site, member)
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
    entry = os.path.join(site, dist_info, "entry_points.txt")
    if os.path.exists(entry):
        section = None
        for line in open(entry):
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif "=" in line and section in ("console_scripts", "gui_scripts"):
                script, _, ref = (p.strip() for p in line.partition("="))
                module, _, attr = ref.partition(":")
                path = os.path.join(prefix, "bin", script)
                attr = attr.split("[")[0].strip()
                with open(path, "w") as out:
                    out.write("#!%s\nimport sys\nfrom %s import %s\nif __name__ == "
                              "'__main__':\n    sys.exit(%s())\n"
                              % (python, module.strip(), attr.split(".")[0], attr))
                os.chmod(path, 0o755)


def checked(entry):
    digest, size, name = entry
    data = fetch(name)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise Failed("%s from the wheelhouse at %s does not match its sha256"
                     % (name, where(base)))
    return data


def main():
    text, wheels, tools = manifest()
    digest = hashlib.sha256((mode + index_url + "\n" + text).encode()).hexdigest()
    if complete(digest):
        print("pilot environment: %s is complete" % target)
        return
    python, site = make_venv()
    if mode == "wheels":
        # fetched in parallel, unpacked one at a time here: unpacking is CPU and threads
        # contending for it cost more than they save (on a busy node, twice the CPU)
        with ThreadPoolExecutor(4) as pool:
            for entry, data in zip(wheels, pool.map(checked, wheels)):
                install(data, entry[2], site, python)
    else:
        if "pip" not in tools:
            raise Failed("the wheelhouse at %s has no pip for index mode" % where(base))
        work = os.path.join(target, ".bootstrap")
        os.makedirs(work, exist_ok=True)
        pip = os.path.join(work, os.path.basename(tools["pip"][2]))
        with open(pip, "wb") as out:
            out.write(checked(tools["pip"]))
        reqs = os.path.join(work, "requirements.txt")
        with open(reqs, "wb") as out:
            out.write(fetch("requirements.txt"))
        project = [w for w in wheels if w[2].split("-")[0] == "elasticslice"]
        if not project:
            raise Failed("the wheelhouse at %s has no elasticslice wheel" % where(base))
        local = os.path.join(work, project[0][2])
        with open(local, "wb") as out:
            out.write(checked(project[0]))
        env = dict(os.environ)
        cmd = [python, os.path.join(pip, "pip"), "install", "--quiet", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
               "-r", reqs, local]
        if index_url:
            cmd[3:3] = ["--index-url", index_url]
            env["PIP_CONFIG_FILE"] = os.devnull
            index = urllib.parse.urlsplit(index_url)
            if index.scheme == "http" and index.netloc == urllib.parse.urlsplit(base).netloc:
                # the wheelhouse's own index (its links carry each wheel's sha256, which pip
                # checks): pip ignores plain HTTP from any host but loopback unless trusted
                cmd[3:3] = ["--trusted-host", index.netloc]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if x.strip()]
            raise Failed("pip could not install the pins from the package index: %s"
                         % (lines[-1] if lines else "exit status %d" % done.returncode))
        shutil.rmtree(work, ignore_errors=True)
    with open(STAMP + ".tmp", "w") as out:
        out.write(digest + "\n")
    os.replace(STAMP + ".tmp", STAMP)
    print("pilot environment: built in %s in %.1f s (%d wheels%s)"
          % (target, time.time() - started, len(wheels), ", pins from the index"
             if mode == "index" else ""))


try:
    main()
except Failed as err:
    sys.stderr.write("pilot environment: %s\n" % err)
    sys.exit(1)
except Exception as err:  # noqa
    sys.stderr.write("pilot environment: cannot build %s: %s: %s\n"
                     % (target, type(err).__name__, err))
    sys.exit(1)
'''.replace("@STAMP@", STAMP)

HEREDOC = "ELASTICSLICE_PILOT_ENV"


def env_script(wheelhouse_url: str | None, *, python: str = "python3",
               target: str = DEFAULT_TARGET, index: bool = False,
               index_url: str | None = None) -> str:
    """POSIX sh lines that build the node agent's environment under ``target`` with
    ``python`` (the image's) from the wheelhouse at ``wheelhouse_url``, or, with ``index``,
    from the package index (``index_url``, default pip's) with the same pins, and end with
    ``py`` set to that environment's Python. ``wheelhouse_url`` None: the image already has
    the agent (``node_python``), and the lines only set ``py`` to ``python``."""
    if any(c in python for c in "\n\r\0") or not python.strip():
        raise ValueError(f"python must be a command (e.g. python3), not {python!r}")
    if wheelhouse_url is None:
        return f"py={shlex.quote(python)}\n"
    for what, value in (("wheelhouse_url", wheelhouse_url), ("index_url", index_url or "http://x")):
        if not value.startswith(("http://", "https://")) or any(c in value for c in
                                                                  "\n\r\0 '\"\\"):
            raise ValueError(f"{what} must be an http(s) URL, not {value!r}")
    if not target.startswith("/") or any(c in target for c in "\n\r\0"):
        raise ValueError(f"target must be an absolute path, not {target!r}")
    words = [python, "-", "index" if index else "wheels", wheelhouse_url, target]
    if index and index_url:
        words.append(index_url)
    q = shlex.quote
    return (f"# the node agent's environment: {q(target)}, built with the image's python from "
            f"the control node's wheelhouse{' (pins from the package index)' if index else ''}\n"
            f"command -v {q(python)} >/dev/null 2>&1 || "
            f"{{ echo {q(f'pilot environment: no {python} on this image')} >&2; exit 1; }}\n"
            f"{shlex.join(words)} <<'{HEREDOC}' || exit 1\n"
            f"{INSTALLER.strip()}\n"
            f"{HEREDOC}\n"
            f"py={q(target + '/bin/python3')}\n")


#: the python3 of CloudLab's standard images (their Ubuntu release's default)
STOCK_PYTHON = {"UBUNTU18-64-STD": "3.6", "UBUNTU20-64-STD": "3.8",
                "UBUNTU22-64-STD": "3.10", "UBUNTU24-64-STD": "3.12"}


def image_python(image_urn: str | None, cm_local: bool) -> str | None:
    """The ``major.minor`` of the ``python3`` that nodes booted from ``image_urn`` have
    (None: unknown). The box's nodes boot this machine's system whatever the image (custom
    images are laid over it), so its ``/usr/bin/python3``; CloudLab's standard images have
    their Ubuntu release's (:data:`STOCK_PYTHON`)."""
    import re
    import shutil
    import subprocess
    if not cm_local:
        name = re.split(r"//|:", image_urn.rsplit("+", 1)[-1])[-1] if image_urn else ""
        return STOCK_PYTHON.get(name)
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
