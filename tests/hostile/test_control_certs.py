"""The control node's own certificates outlive the first one: a server renews its certificate
while it runs (members' certificates last 7 days; here 5 seconds), so a run or a resume past
their lifetime keeps its TLS. The peer verifies each handshake against the cluster CA, as
nodes do: an expired certificate would fail it."""
from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509

from elasticslice.pilots.ca import ClusterCA, renew_scheduler
from elasticslice.pilots.enrol import EnrolmentService
from tests.helpers import wait_for

LIFETIME = 5.0  # seconds a member's certificate lasts in these tests


def served(ca: ClusterCA, port: int, client: str | None = None) -> x509.Certificate:
    """The certificate a server on 127.0.0.1:``port`` shows, in a handshake that verifies
    it against the cluster CA and the address (as a node's does); with member ``client``'s
    certificate for a server that asks for one."""
    context = ssl.create_default_context(cafile=str(ca.ca_file))
    if client is not None:
        context.load_cert_chain(*ca.issue(client))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def expired(cert: x509.Certificate) -> bool:
    return time.time() > cert.not_valid_after_utc.timestamp()


@pytest.mark.slow  # waits for a certificate to expire
def test_the_enrolment_service_renews_its_certificate_before_it_expires(tmp_path: Path
                                                                       ) -> None:
    ca = ClusterCA.open(tmp_path / "pki", member_lifetime=LIFETIME)
    service = EnrolmentService(ca).start()
    try:
        first = served(ca, service.bound_port)
        assert first.subject.rfc4514_string() == "OU=control,CN=enrolment"
        wait_for(lambda: expired(first), timeout=4 * LIFETIME, what="the first certificate "
                 "to expire")
        second = served(ca, service.bound_port)   # verified: not expired
        assert second.serial_number != first.serial_number
        assert second.not_valid_after_utc > first.not_valid_after_utc
        assert second.subject == first.subject
        # and the service answers over it (a token it never gave: refused, in one line)
        request = urllib.request.Request(
            f"{service.url}/enrol", json.dumps({"token": "x" * 43, "client_id": "node-1",
                                                "csr": "-"}).encode(),
            {"Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=str(ca.ca_file))
        try:
            urllib.request.urlopen(request, context=context, timeout=10)
        except urllib.error.HTTPError as err:
            assert 400 <= err.code < 500
        else:
            raise AssertionError("a foreign token was accepted")
    finally:
        service.stop()


def test_a_member_certificate_is_issued_for_the_lifetime_asked(tmp_path: Path) -> None:
    """The default stays 7 days; a CA opened with another lifetime issues for that one."""
    week = ClusterCA.open(tmp_path / "week")
    cert = x509.load_pem_x509_certificate(week.issue("scheduler")[0].read_bytes())
    assert 6.9 * 86400 < (cert.not_valid_after_utc.timestamp() - time.time()) <= 7 * 86400
    short = ClusterCA.open(tmp_path / "short", member_lifetime=LIFETIME)
    cert = x509.load_pem_x509_certificate(short.issue("scheduler")[0].read_bytes())
    assert cert.not_valid_after_utc.timestamp() - time.time() <= LIFETIME


@pytest.mark.slow  # waits for a certificate to expire
def test_the_dask_scheduler_renews_its_certificate_before_it_expires(tmp_path: Path) -> None:
    """The elastic cluster's scheduler (in-process, as ``ElasticCluster`` runs it, its
    certificate kept renewed by :func:`renew_scheduler`): after its first certificate
    expired it still accepts TLS, with a new one, and a new client joins it."""
    from distributed import Client

    from troy.frameworks.dask import DaskFramework
    ca = ClusterCA.open(tmp_path / "pki", member_lifetime=LIFETIME)
    framework = DaskFramework("certs", tls=ca.dask_tls("scheduler"))
    framework.start()
    try:
        assert renew_scheduler(framework, ca) >= 2   # its listener, its connections out
        port = int(framework.scheduler_address.rsplit(":", 1)[1])
        first = served(ca, port, client="probe")
        assert first.subject.rfc4514_string() == "OU=control,CN=scheduler"
        wait_for(lambda: expired(first), timeout=4 * LIFETIME, what="the first certificate "
                 "to expire")
        second = served(ca, port, client="probe")
        assert second.serial_number != first.serial_number
        assert second.not_valid_after_utc > first.not_valid_after_utc
        with Client(framework.scheduler_address, security=ca.dask_tls("client").security(),
                    timeout="20s", set_as_default=False) as client:
            assert client.scheduler_info()["address"] == framework.scheduler_address
    finally:
        framework.close()
