"""The helper that makes every node a Troy pilot: its startup command is the pilot agent.

The nodes of a slice share one install tarball (:mod:`elasticslice.pilots.slicetar`: one URL
the CM fetches once per sliver change, whatever the number of nodes held, served at the same
URL across restarts), rooted at ``/`` (CloudLab's AddNodes installs tarballs at ``/``), and
unpacked by CloudLab as root with the archive's owners and modes. Under
:attr:`PilotElasticSliceHelper.INSTALL_PATH` (``/local/pilot``) it holds the cluster CA's
certificate, ``start.sh`` and, for each node not enrolled yet, its single-use enrolment token
(``nodes/<client_id>/token``, root's, 0600; bound to that client_id, valid until its boot
deadline, dropped from the tarball once spent); no key, no certificate of any node.

CloudLab runs the startup command ``sh /local/pilot/start.sh`` as the experiment's user (not
root), with ``/bin/sh -c``, from the boot scripts' folder, HOME and PATH, at every boot, its
output in the node's runlog. ``start.sh`` makes ``/local/pilot`` that user's (``sudo -n
chown``: tarballs are root's), takes its own token (``sudo -n cat``) and removes every node's
tokens from the disk, asks ``geni-get client_id`` for the node's name, builds or finds the
agent's environment (:func:`~elasticslice.pilots.bootstrap.env_script`: the image's
``python3``, the wheelhouse the control node publishes; or ``node_python``, an image's own),
enrols (``python -m troy.frameworks.dask.enrol``: the node makes its own key and gets a
short-lived certificate from the control node's :class:`~elasticslice.pilots.enrol.
EnrolmentService`, pinning the cluster CA) unless a reboot finds its key and a certificate
still valid, then starts::

    "$py" -m troy.frameworks.dask node tls://HOST:PORT CORES CLIENT_ID [ADDRESS]

with the node's cores (``nproc``; the box's nodes say theirs in ``ELASTICSLICE_CORES``, a
box-only hint), Dask's TLS variables pointing at the files the node made, and
``TROY_NODE_RENEW_URL`` (the agent renews its certificate). ADDRESS is the node's own
address in the sliver's manifest (``geni-get manifest``) when it is configured on the node.
A step that fails ends the script with one line naming the cause, which also goes to the
control node (``POST <report_url>``, :meth:`TarballPublisher.accept_reports`): the run names
the node and why at once. No secret is on a command line or in a log.
"""
from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any

from elasticslice.config import PilotSettings, default_listen, load_pilot_settings
from elasticslice.errors import ElasticSliceError
from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.pilots.slicetar import NAME as SLICE_TARBALL
from elasticslice.pilots.slicetar import NODES, Member, SliceTarball
from elasticslice.rspec import NodeSpec
from troy.frameworks.dask import RENEW_URL_ENV, DaskTLS

log = logging.getLogger(__name__)

DEFAULT_NODE_PYTHON = "python3"
DEFAULT_ENROL_WITHIN = 1800.0  # seconds from a tarball's making to its node's boot deadline


def python_lines(node_python: str) -> str:
    """The sh lines that set ``py`` to the command running the agent's Python:
    ``node_python`` itself when it is one word, else the tarball's ``python`` wrapper
    (:func:`python_wrapper`), so that ``"$py" -m ...`` works either way."""
    if len(shlex.split(node_python)) == 1:
        return f"py={node_python}\n"
    return 'py="$here/python"\n'


def python_wrapper(node_python: str) -> bytes | None:
    """The ``python`` script a ``node_python`` of several words runs through (None: one)."""
    if len(shlex.split(node_python)) == 1:
        return None
    return f'#!/bin/sh\nexec {node_python} "$@"\n'.encode()


REPORT = ("import json, sys, urllib.request as u; u.urlopen(u.Request(sys.argv[1], "
          "json.dumps({'client_id': sys.argv[2], 'line': sys.argv[3]}).encode(), "
          "{'Content-Type': 'application/json'}), timeout=10)")


def script_head(what: str, install: str, report_url: str | None) -> str:
    """The first lines of a node's start script, run by CloudLab as the experiment's user:
    ``fail`` (one line on stderr, then to the control node), ``asroot`` (sudo -n unless
    root), ``name`` from geni-get, and ``$here`` made this user's (tarballs are root's)."""
    report = (f"report_url={shlex.quote(report_url)}\n"
              "report() {  # best effort: the CM's status says the startup failed, this says why\n"
              '    for p in "${py:-}" python3; do\n'
              '        [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 || continue\n'
              f'        "$p" -c {shlex.quote(REPORT)} "$report_url" "${{name:-?}}" "$1" '
              ">/dev/null 2>&1 && return\n"
              "    done\n"
              "}\n") if report_url else "report() { :; }\n"
    return (f"#!/bin/sh\n"
            f"# {what}\n"
            f"# Run by CloudLab as the experiment's user (not root), at every boot.\n"
            f"here={shlex.quote(install)}\n"
            f"{report}"
            "cause=\n"
            'fail() { cause=$1; echo "${name:-node}: $1" >&2; exit 1; }\n'
            'finish() {  # on exit: the setup\'s errors to the runlog, the cause to the control node\n'
            '    status=$?\n'
            '    [ -n "${err:-}" ] && [ -s "$err" ] && cat "$err" >&3\n'
            '    if [ "$status" != 0 ]; then\n'
            '        [ -n "$cause" ] || cause=$(grep -v "^[[:space:]]*$" "${err:-/dev/null}" 2>/dev/null | tail -n 1)\n'
            '        report "${cause:-the start script exited with status $status}"\n'
            '    fi\n'
            '}\n'
            "trap finish EXIT\n"
            "exec 3>&2\n"
            'asroot() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }\n'
            'name=$(geni-get client_id) || fail "geni-get client_id failed"\n'
            '[ -O "$here" ] || asroot chown "$(id -u):$(id -g)" "$here" || '
            'fail "cannot make $here this user\'s (sudo -n chown): the node needs passwordless sudo"\n'
            'umask 077\n'
            'err="$here/.start.err"\n'
            'exec 2>"$err"  # shown in the runlog when the script ends, or before the agent starts\n')


def agent_script(scheduler: str, node_python: str, enrol_url: str,
                 env_lines: str | None = None, report_url: str | None = None,
                 install: str = "/local/pilot") -> str:
    """``start.sh``: take this node's token (or, after a reboot, its key and a certificate
    still valid), find or build the agent's Python, enrol (the node makes its key), then the
    node agent with TLS files next to the script, named by geni-get, advertising its
    manifest address when it has one. ``env_lines``: sh lines that set ``py``
    (``bootstrap.env_script()``); default ``node_python``. ``report_url``: where a failure's
    cause is posted."""
    env = DaskTLS('"$here"/ca.pem', '"$here"/node.pem', '"$here"/node.key').environ()
    env[RENEW_URL_ENV] = shlex.quote(enrol_url)
    exports = "\n".join(f"export {key}={value}" for key, value in sorted(env.items()))
    python = env_lines if env_lines is not None else python_lines(node_python)
    url = shlex.quote(enrol_url)
    head = script_head(f"this node's pilot agent: enrols at {enrol_url}, then a Dask worker "
                       f"joining {scheduler} over TLS", install, report_url)
    return (f"{head}"
            f"# --- this node's enrolment token, if it has none of its own yet; nobody's else\n"
            f'if [ ! -s "$here/node.pem" ] || [ ! -s "$here/node.key" ]; then\n'
            f'    asroot cat "$here/{NODES}/$name/token" > "$here/token" 2>/dev/null || '
            f'rm -f "$here/token"\n'
            f"fi\n"
            f'asroot rm -rf "$here/{NODES}" || fail "cannot remove $here/{NODES}"\n'
            f"# --- the agent's Python: these lines set py ---\n"
            f"{python.rstrip()}\n"
            f'command -v "$py" >/dev/null 2>&1 || fail "no $py on this image"\n'
            f"# --- the address to advertise (meanwhile): the manifest's, if configured here ---\n"
            f'(geni-get manifest 2>/dev/null | "$py" -m troy.frameworks.dask.enrol --advertise '
            f'"$name" > "$here/address" || :) &\n'
            f"advertise=$!\n"
            f"# --- enrolment: this node makes its key; the token is spent ---\n"
            f'if [ -s "$here/token" ]; then\n'
            f'    "$py" -m troy.frameworks.dask.enrol {url} "$here/token" "$here/ca.pem" '
            f'"$name" "$here" || exit 1\n'
            f'elif [ ! -s "$here/node.pem" ] || [ ! -s "$here/node.key" ]; then\n'
            f'    fail "no enrolment token for $name in the tarball and no certificate in $here"\n'
            f"else  # a reboot: the key and certificate it made (the agent renews it)\n"
            f'    "$py" -m troy.frameworks.dask.enrol --valid "$here/node.pem" || exit 1\n'
            f"fi\n"
            f"{exports}\n"
            f'wait "$advertise"; host=$(cat "$here/address" 2>/dev/null) || host=\n'
            f'cores="${{ELASTICSLICE_CORES:-$(nproc)}}"  # ELASTICSLICE_CORES: the box only\n'
            f'[ -s "$err" ] && cat "$err" >&3\n'
            f"trap - EXIT\n"
            f"exec 2>&3 3>&-\n"
            f'exec "$py" -m troy.frameworks.dask node {shlex.quote(scheduler)} '
            f'"$cores" "$name" ${{host:+"$host"}}\n')


def node_command(value: str) -> str:
    """``node_python`` checked and quoted for a shell (one command, with arguments)."""
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise ValueError(f"node_python {value!r}: {err}") from None
    if not words or any(c in value for c in "\n\r\0"):
        raise ValueError(f"node_python must be a command (e.g. python3), not {value!r}")
    return shlex.join(words)


class PilotElasticSliceHelper(SimpleElasticSliceHelper):
    """A :class:`SimpleElasticSliceHelper` whose nodes run the Troy node agent.

    ``ca``: the cluster CA; ``scheduler``: the Dask scheduler's ``tls://`` address;
    ``tarball_dir``: where the slice's tarball is kept (0700); ``publisher``: a started
    :class:`TarballPublisher` that serves it to the CM, under ``token`` (the URL segment a
    restarted cluster keeps: :class:`~elasticslice.pilots.slicetar.PublishedSlice`; None: a
    new one); ``enrolment``: the started :class:`~elasticslice.pilots.enrol.
    EnrolmentService` that issues each node's token and certificate; ``enrol_url``: its URL
    as nodes reach it (default its own); ``enrol_within``: seconds from a node's token to its
    boot deadline; ``report_url``: where nodes post why their start failed (None: nowhere);
    ``node_python``: the command running Python with the agent on the node's image (default:
    ``[pilots] node_python`` of the server's config, else ``python3``); ``image_urn``: the
    image nodes boot (default: ``[pilots] disk_image``). Other options as
    :class:`SimpleElasticSliceHelper`."""

    INSTALL_PATH = "/local/pilot"

    def __init__(self, ca: ClusterCA, scheduler: str, tarball_dir: Path, *,
                 publisher: TarballPublisher | None = None, enrolment: Any = None,
                 enrol_url: str | None = None, enrol_within: float = DEFAULT_ENROL_WITHIN,
                 node_python: str | None = None, image_urn: str | None = None,
                 server: Any = None, config: Any = None, num_pcs: int = 1,
                 token: str | None = None, report_url: str | None = None,
                 **options: Any) -> None:
        settings = _settings(server)
        super().__init__(server, config, num_pcs=num_pcs,
                         image_urn=image_urn or settings.disk_image, **options)
        if not scheduler.startswith("tls://"):
            raise ValueError(f"the pilots' scheduler must be tls://, not {scheduler!r}")
        #: the image has the agent's environment (``node_python`` given): nothing to build;
        #: else the node builds it with the image's ``python3`` (``env_lines``, the cluster's)
        self.has_environment = bool(node_python or settings.node_python)
        self.node_python = node_command(node_python or settings.node_python
                                        or DEFAULT_NODE_PYTHON)
        self.ca = ca
        self.scheduler = scheduler
        self.tarball_dir = Path(tarball_dir)
        self.publisher = publisher
        self.token = token
        self.report_url = report_url
        self.enrolment = enrolment
        self.enrol_url = enrol_url
        self.enrol_within = enrol_within
        #: sh lines that set ``py`` (bootstrap.env_script(); None: from node_python)
        self.env_lines: str | None = None
        self.startup_command = f"sh {self.INSTALL_PATH}/start.sh"
        self.slice_tarball = SliceTarball(self.tarball_dir / SLICE_TARBALL, self.INSTALL_PATH,
                                          {})
        self._url: str | None = None

    def common_files(self) -> dict[str, Member]:
        """What every node gets: the CA's certificate and the start script (and the
        ``python`` wrapper of a ``node_python`` of several words)."""
        if self.enrolment is None:
            raise ElasticSliceError("the pilot helper has no enrolment service: nodes enrol "
                                    "to get their certificate")
        url = self.enrol_url or self.enrolment.url
        script = agent_script(self.scheduler, self.node_python, url, self.env_lines,
                              self.report_url, self.INSTALL_PATH)
        files = {"ca.pem": Member(self.ca.cert_pem, 0o644),
                 "start.sh": Member(script.encode(), 0o755)}
        wrapper = python_wrapper(self.node_python) if self.env_lines is None else None
        if wrapper is not None:
            files["python"] = Member(wrapper, 0o755)
        return files

    def tarball_url(self) -> str:
        """Where the CM fetches the slice's tarball (published once; the file is made now
        if it is not there)."""
        if self._url is None:
            if self.publisher is None:
                raise ElasticSliceError("the pilot helper has no tarball publisher: nodes "
                                        "fetch their tarball by URL")
            self.slice_tarball.set_common(self.common_files())
            self._url = self.publisher.publish(self.slice_tarball.path, SLICE_TARBALL,
                                               token=self.token)
        return self._url

    def node_spec(self, client_id: str) -> NodeSpec:
        """The node: the slice's tarball, which now holds a new token for it (voiding any
        earlier one), valid until its boot deadline."""
        url = self.tarball_url()
        token = self.enrolment.token_for(client_id, deadline=time.time() + self.enrol_within)
        self.slice_tarball.set_node(client_id, {"token": Member(token.encode(), 0o600)})
        spec = super().node_spec(client_id)
        spec.installs = [*spec.installs, (url, "/")]
        return spec

    def enrolled(self, client_id: str) -> None:
        """The node spent its token: the tarball stops carrying it."""
        self.slice_tarball.drop_node(client_id)

    def forget_node(self, client_id: str) -> None:
        """The node left: its token goes, from the enrolment service and the tarball."""
        if self.enrolment is not None:
            self.enrolment.forget(client_id)
        try:
            self.slice_tarball.drop_node(client_id)
        except OSError as err:
            log.warning("cannot remake the slice's tarball: %s", err.strerror or err)

    def forget_all(self) -> None:
        """Every node's token leaves the tarball, made again without them (a new process
        starts: the nodes that have theirs enrol with the hashes the service kept)."""
        if self.enrolment is not None:
            for client_id in self.slice_tarball.nodes():
                self.enrolment.forget(client_id)
        try:
            self.slice_tarball.drop_all()
        except OSError as err:
            log.warning("cannot remake the slice's tarball in %s: %s", self.tarball_dir,
                        err.strerror or err)

    def close(self, *, remove: bool) -> None:
        """Stop serving the tarball; ``remove`` (the slice was given back): delete it too."""
        url, self._url = self._url, None
        if url is not None and self.publisher is not None:
            self.publisher.withdraw(url)
        if self.enrolment is not None:
            for client_id in self.slice_tarball.nodes():
                self.enrolment.forget(client_id)
        if remove:
            self.slice_tarball.path.unlink(missing_ok=True)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        if node.get("client_id"):
            self.forget_node(str(node["client_id"]))


def _settings(server: Any) -> PilotSettings:
    """``[pilots]`` of the server's config file (empty when there is none)."""
    path = getattr(getattr(server, "config", None), "path", None)
    return load_pilot_settings(path) if path is not None else PilotSettings()


def pilots_listen(server: Any) -> str:
    """Where the nodes reach this machine, for a cluster without ``listen`` of its own: the
    ``[pilots] listen`` of the server's config (the box writes its control address there),
    else :func:`~elasticslice.config.default_listen` of its CM URLs."""
    cm_urls = getattr(getattr(server, "config", None), "cm_urls", ())
    return _settings(server).listen or default_listen(cm_urls)
