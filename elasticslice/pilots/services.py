"""The control node's services that nodes reach besides the scheduler, in one object.

:class:`ControlServices` runs, on the address the nodes reach (``listen``):

- the slice's tarball and the nodes' software, served by a
  :class:`~elasticslice.pilots.publish.TarballPublisher` at URLs kept across restarts
  (:class:`~elasticslice.pilots.slicetar.PublishedSlice`: the CM fetches every tarball URL of
  the sliver again at every sliver change), with the route a node reports a failed start on;
- the :class:`~elasticslice.pilots.enrol.EnrolmentService`, which issues the nodes' worker
  certificates from the cluster CA, on the port the last process of the state directory used
  (the nodes' agents renew there), its tokens' hashes kept for the next process and the
  certificates of nodes that left on the deny list.

A helper (the pilots' :class:`~elasticslice.pilots.helper.PilotElasticSliceHelper`) puts what
these say into the slice's one tarball. In the control node's split by trust
(docs/design.md) these are the manager daemon's: they hold the CA key and read only bounded,
typed requests from nodes.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.enrol import EnrolmentError, EnrolmentService
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.pilots.restart import read_json, write_json
from elasticslice.pilots.slicetar import PublishedSlice
from troy.frameworks.dask import DenyList

log = logging.getLogger(__name__)

ENROL_FILE = "enrol.json"          # the enrolment service's port, for the next process
TOKENS_FILE = "enrol-tokens.json"  # the tokens' hashes, for a node booting at a restart
DENY_FILE = "denied-certs.json"    # serials of the certificates of nodes that left


class ControlServices:
    """See the module docstring. ``manager()`` and ``helper()``: the running manager and the
    slice's helper (None while there is none): the manager's word on a node (enrolment is
    taken only from a held node's manifest address), the helper told when a node got its
    first certificate (its token leaves the tarball); ``failures``: where a node's report
    of a failed start goes (the CM's status decides; the manager's ``update_sliver_status``
    is woken); ``on_key``: the enrolment service's ``/key`` route (Parsl's CurveZMQ keys;
    None: none). ``enrol_port``,
    ``publish_port``: fixed ports (None: the last process', else any); ``public_url``: the
    base URL the CM fetches from (None: the publisher's own)."""

    def __init__(self, state_dir: Path, ca: ClusterCA, listen: str, *,
                 manager: Callable[[], Any], helper: Callable[[], Any],
                 failures: NodeFailures,
                 on_key: Callable[[str, str], dict[str, str]] | None = None,
                 deny: DenyList | None = None, cert_lifetime: float = 3600.0,
                 enrol_port: int | None = None, publish_port: int | None = None,
                 public_url: str | None = None) -> None:
        self.state_dir, self.ca, self.listen = Path(state_dir), ca, listen
        self.manager, self.helper, self.failures = manager, helper, failures
        self.on_key = on_key
        self.denied = deny if deny is not None else DenyList(self.state_dir / DENY_FILE)
        self.cert_lifetime = cert_lifetime
        self.enrol_port, self.publish_port, self.public_url = enrol_port, publish_port, \
            public_url
        self.published: PublishedSlice | None = None
        self.publisher: TarballPublisher | None = None
        self.enrolment: EnrolmentService | None = None
        self.report_url: str | None = None
        self.wheelroot: Any = None   # the nodes' software, closed with the publisher

    # ------------------------------------------------------------------ running
    def start(self) -> ControlServices:
        """The publisher (and its report route), then the enrolment service; on failure
        what started is stopped."""
        try:
            self.published = PublishedSlice(self.state_dir, self.listen,
                                            port=self.publish_port, public_url=self.public_url)
            self.publisher = self.published.start()
            self.report_url = self.publisher.accept_reports("report", self._on_report,
                                                            token=self.token)
            self.enrolment = self._start_enrolment()
        except BaseException:
            self.close(remove=False)
            raise
        return self

    @property
    def token(self) -> str:
        """The publisher's URL token (kept across restarts)."""
        if self.published is None:
            raise ElasticSliceError("the control services are not started")
        return self.published.token

    @property
    def enrol_url(self) -> str:
        """Where nodes enrol: ``https://<listen>:<port>``."""
        if self.enrolment is None:
            raise ElasticSliceError("the control services are not started")
        host = f"[{self.listen}]" if ":" in self.listen else self.listen
        return f"https://{host}:{self.enrolment.bound_port}"

    def _start_enrolment(self) -> EnrolmentService:
        """On the port the last process of this state dir used (the nodes' agents renew
        there), else on any."""
        path = self.state_dir / ENROL_FILE
        try:
            port = int((read_json(path) or {}).get("port", 0))
        except (ElasticSliceError, ValueError, TypeError):
            port = 0
        if self.enrol_port is not None:
            port = self.enrol_port

        def make(at: int) -> EnrolmentService:
            return EnrolmentService(self.ca, self.listen, at, is_held=self._is_held,
                                    address_of=self._address_of,
                                    cert_lifetime=self.cert_lifetime,
                                    on_enrolled=self._enrolled, on_key=self.on_key,
                                    keep=self.state_dir / TOKENS_FILE,
                                    deny=self.denied).start()
        try:
            service = make(port)
        except EnrolmentError as err:
            if not port or self.enrol_port is not None:
                raise
            log.warning("the enrolment port %d is taken (%s): the nodes' agents cannot renew "
                        "there", port, err)
            service = make(0)
        write_json(path, {"port": service.bound_port})
        return service

    # -- the manager's word, for the nodes' requests ------------------------------------------
    def _is_held(self, client_id: str) -> bool:
        manager = self.manager()
        return manager is not None and manager.holdings.holds(client_id)

    def _address_of(self, client_id: str) -> str | None:
        """The control address the manifest gives ``client_id`` (enrolment is taken only
        from there)."""
        manager = self.manager()
        return manager.holdings.address_of(client_id) if manager is not None else None

    def _enrolled(self, client_id: str) -> None:
        helper = self.helper()
        if helper is not None:
            helper.enrolled(client_id)

    def _on_report(self, data: dict[str, Any], peer: str) -> None:
        """A node's start failed, it says why (a claim: the CM's status decides)."""
        client_id, manager = data.get("client_id"), self.manager()
        if isinstance(client_id, str) and manager is not None and \
                manager.holdings.holds(client_id) and \
                self.failures.report(client_id, data.get("line")):
            manager.wake("update_sliver_status")

    def node_software(self, *, image_urn: str | None, image_python: str | None,
                      cm_urls: Sequence[str] = (), extra: Sequence[str] = (),
                      target: str | None = None) -> str:
        """The ``start.sh`` lines that build a node's environment from the wheelhouse root
        this publisher serves (each node gets the wheelhouse of its own Python and machine,
        the image's expected one built ahead when known), at a URL kept across restarts,
        verified by the node against the cluster CA. ``extra``: more of the project's
        extras in it (``parsl``); ``target``: where the node builds it (None: the
        default)."""
        from elasticslice.config import cm_is_local
        from elasticslice.pilots.bootstrap import env_script
        from elasticslice.pilots.wheelroot import serve_for_image
        if self.published is None or self.publisher is None:
            raise ElasticSliceError("the control services are not started")
        options: dict[str, Any] = {"extra": tuple(extra)} if extra else {}
        self.wheelroot, url = serve_for_image(
            self.publisher, image_urn=image_urn, image_python=image_python,
            cm_local=bool(cm_urls) and all(cm_is_local(u) for u in cm_urls),
            token=self.token, ca=self.ca, keep=self.state_dir / "wheelhouse.json", **options)
        self.published.serving.append(self.wheelroot)
        kwargs: dict[str, Any] = {"target": target} if target is not None else {}
        return env_script(url, python="python3", ca=self.ca.cert_pem, **kwargs)

    # ------------------------------------------------------------------ stopping
    def close(self, *, remove: bool) -> None:
        """Stop serving (idempotent). ``remove``: the slice is gone, so no node is left to
        enrol: the tokens' file goes too."""
        if self.enrolment is not None:
            self.enrolment.stop()
            if remove:
                (self.state_dir / TOKENS_FILE).unlink(missing_ok=True)
            self.enrolment = None
        if self.published is not None:
            self.published.stop()
            self.published = None
        self.publisher = None
        self.wheelroot = None  # closed with the publisher


def pilot_helper(services: ControlServices, ca: Any, scheduler: str, state_dir: Path,
                 server: Any, *, node_python: str | None, image_urn: str | None,
                 nodetype: str | None, image_python: str | None) -> Any:
    """The pilots' helper (what a node is: its tarball tells its agent where to join,
    ``scheduler``), its tarball made again without the tokens a killed process put in it
    (the service keeps their hashes: a node that has its tarball already still enrols) and
    served before any sliver change (the CM fetches it again at every one)."""
    from elasticslice.pilots.helper import PilotElasticSliceHelper
    helper = PilotElasticSliceHelper(
        ca, scheduler, state_dir / "tarballs", publisher=services.publisher,
        enrolment=services.enrolment, token=services.token, report_url=services.report_url,
        enrol_url=services.enrol_url, server=server, node_python=node_python,
        image_urn=image_urn, nodetype=nodetype)
    helper.forget_all()
    if not helper.has_environment:  # the node builds it from our wheelhouse
        urls = list(getattr(getattr(server, "config", None), "cm_urls", None) or [])
        helper.env_lines = services.node_software(
            image_urn=helper.image_urn, image_python=image_python, cm_urls=urls)
    helper.tarball_url()
    return helper
