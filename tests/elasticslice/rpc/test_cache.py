"""The on-disk credential cache and the small pure helpers of the client."""
from __future__ import annotations

import datetime as dt
import stat

import pytest

from elasticslice.rpc import credential as cr
from elasticslice.rpc import pki
from elasticslice.rpc.cache import CredentialCache
from elasticslice.rpc.client import slice_urn_for
from elasticslice.rpc.cm import SliverStatus, default_dynslice_url, format_expiration

UTC = dt.timezone.utc
OWNER = "urn:publicid:IDN+emulab.test+user+alice"
TARGET = "urn:publicid:IDN+emulab.test+slice+s1"


@pytest.fixture(scope="module")
def signer():
    ca, ca_key = pki.make_ca("ca")
    return ca, ca_key


def _cred(signer, minutes: float) -> str:
    ca, key = signer
    return cr.sign_credential(cr.Credential(
        owner_gid="", owner_urn=OWNER, target_gid="", target_urn=TARGET,
        expires=dt.datetime.now(UTC) + dt.timedelta(minutes=minutes)), ca, key)


def test_cache_persists_with_private_modes(tmp_path, signer):
    xml = _cred(signer, 60)
    CredentialCache(tmp_path / "c").put(OWNER, TARGET, xml)
    fresh = CredentialCache(tmp_path / "c")
    assert fresh.get(OWNER, TARGET) == xml
    files = list((tmp_path / "c").rglob("*.xml"))
    assert len(files) == 1
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    assert fresh.get("urn:publicid:IDN+emulab.test+user+bob", TARGET) is None


def test_cache_forgets_credentials_about_to_expire(tmp_path, signer):
    cache = CredentialCache(tmp_path / "c")
    cache.put(OWNER, TARGET, _cred(signer, 3))  # inside the 5 minute margin
    assert cache.get(OWNER, TARGET) is None
    assert list((tmp_path / "c").rglob("*.xml")) == []
    cache.put(OWNER, TARGET, _cred(signer, 60))
    later = dt.datetime.now(UTC) + dt.timedelta(minutes=56)
    assert cache.get(OWNER, TARGET, now=later) is None


def test_corrupt_cache_file_is_a_miss(tmp_path, signer):
    cache = CredentialCache(tmp_path / "c")
    cache.put(OWNER, TARGET, _cred(signer, 60))
    for f in (tmp_path / "c").rglob("*.xml"):
        f.write_text("garbage")
    assert CredentialCache(tmp_path / "c").get(OWNER, TARGET) is None


def test_slice_urns_and_urls():
    assert slice_urn_for("emulab.net", "s1") == "urn:publicid:IDN+emulab.net+slice+s1"
    assert slice_urn_for("emulab.net", "s1", "proj") == \
        "urn:publicid:IDN+emulab.net:proj+slice+s1"
    assert default_dynslice_url("https://h:12369/protogeni/xmlrpc/cm/2.0") == \
        "https://h:12369/protogeni/xmlrpc/dynslice"
    assert default_dynslice_url("https://h/project/p/protogeni/xmlrpc/cm") == \
        "https://h/project/p/protogeni/xmlrpc/dynslice"
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert format_expiration(when) == "2030-01-02T01:04:05Z"
    with pytest.raises(ValueError):
        format_expiration(dt.datetime(2030, 1, 1))


def test_sliver_status_from_cloudlab_struct():
    value = {"status": "mixed", "state": "started", "utc": 5, "error": "",
             "details": {"urn:s2": {"client_id": "b", "status": "notready", "state": "started",
                                    "component_urn": "urn:n2", "rawstate": "BOOTING"},
                         "urn:s1": {"client_id": "a", "status": "ready", "state": "started",
                                    "component_urn": "urn:n1", "execute_state": "exited",
                                    "execute_status": 0}}}
    st = SliverStatus.from_value(value)
    assert [n.client_id for n in st.nodes] == ["a", "b"]
    assert st.node("a").ready and st.node("a").execute_status == "0"
    assert not st.ready and st.node("b").component_id == "urn:n2"
    data = st.to_json()
    assert data["status"] == "mixed" and data["nodes"][1]["status"] == "notready"
