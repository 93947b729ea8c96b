"""The wheelhouse root: one URL under which each node finds the wheelhouse that fits it; 503
while the control node builds it, 404 with one line saying why it has none."""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from elasticslice.pilots import wheeltags
from elasticslice.pilots.publish import TarballPublisher, Unavailable
from elasticslice.pilots.wheelhouse import WheelhouseError, this_platform, this_python
from elasticslice.pilots.wheelroot import WheelhouseRoot

OWN = wheeltags.node_tag(tuple(int(x) for x in this_python().split(".")), this_platform())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_names_it_does_not_build_are_404_with_the_reason(tmp_path: Path) -> None:
    """Nothing is built for them (no thread started), and the answer says why."""
    root = WheelhouseRoot(cache=tmp_path)
    for path, why in {
            "cp39-manylinux_2_35_x86_64/wheels.txt": "the node agent needs Python 3.10 or later",
            "cp37-manylinux_2_35_x86_64/wheels.txt": "Python 3.7: this control node builds "
                                                     "wheelhouses for Python 3.8 to 3.14",
            "cp312-manylinux_2_39_ppc64le/wheels.txt": "machine ppc64le: this control node "
                                                       "builds wheelhouses for x86_64 and "
                                                       "aarch64",
            "cp312-linux_aarch64/wheels.txt": "a node without glibc (linux_aarch64): this "
                                              "control node builds manylinux wheelhouses only",
            "wheels.txt": "'wheels.txt' is not a wheelhouse name "
                          "(cpXY-manylinux_2_N_MACHINE)"}.items():
        assert root.resolve(path) == Unavailable(404, why), path
    assert root.resolve("") is None
    assert root._thread is None and list(tmp_path.iterdir()) == []
    for python, why in (("3.9", "the node agent needs Python 3.10 or later"),
                        ("3.7", "Python 3.7: this control node builds wheelhouses for")):
        with pytest.raises(WheelhouseError, match=f"no wheelhouse for Python {python} on "
                                                  f"manylinux_2_35_x86_64: {why}"):
            root.build_ahead(python, "manylinux_2_35_x86_64")
    assert root._thread is None


def test_it_is_served_at_one_url_that_a_token_keeps(tmp_path: Path) -> None:
    root = WheelhouseRoot(cache=tmp_path)
    publisher = TarballPublisher().start()
    try:
        url = root.publish(publisher, token="t" * 32)
        assert url == f"{publisher.base_url}/{'t' * 32}/wheelhouse/"
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(url + "cp39-manylinux_2_35_x86_64/wheels.txt", timeout=10)
        assert answer.value.code == 404
        assert answer.value.read() == b"the node agent needs Python 3.10 or later\n"
    finally:
        publisher.stop()
        root.close()


@pytest.mark.slow
def test_a_node_waits_while_its_wheelhouse_is_built_then_gets_it() -> None:
    """The first ask starts the build (503, Retry-After); once built, that node and every node
    of this Python and machine whose glibc its wheels allow get the same wheelhouse, with no
    second build (the wheelhouses cached where the clusters keep them)."""
    root = WheelhouseRoot()
    try:
        first = root.resolve(f"{OWN}/wheels.txt")
        assert isinstance(first, Unavailable) and first.status == 503
        assert first.retry_after and first.reason == "the control node is building it now"
        house = root.wheelhouse(timeout=240)
        assert root.resolve(f"{OWN}/wheels.txt") == house.directory / "wheels.txt"
        assert root.resolve(f"{OWN}/") == house.directory
        assert root.resolve(f"{OWN}/no-such.whl") is None
        (python, arch, glibc) = wheeltags.parse_node_tag(OWN)
        newer = wheeltags.node_tag(python, wheeltags.platform_tag(arch, (2, glibc[1] + 3)))
        assert root.resolve(f"{newer}/wheels.txt") == house.directory / "wheels.txt"
        assert "ready=['%s'], building=None, queued=[]" % OWN in repr(root)
    finally:
        root.close()


@pytest.mark.slow
def test_a_failed_build_is_404_with_its_reason_then_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A control node that cannot reach the package index: the node of another Python is
    told pip's reason, the root remembers it (no build at every ask) and tries again after
    ``retry_failed_after``."""
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "1")
    clock = Clock()
    other = "3.12" if this_python() != "3.12" else "3.10"
    tag = wheeltags.node_tag(tuple(int(x) for x in other.split(".")), "manylinux_2_35_aarch64")
    root = WheelhouseRoot(cache=tmp_path, clock=clock, retry_failed_after=600)
    try:
        assert root.resolve(f"{tag}/wheels.txt").status == 503
        with pytest.raises(WheelhouseError) as failed:
            root.wheelhouse(other, "manylinux_2_35_aarch64", timeout=240)
        reason = str(failed.value)
        assert reason.startswith("pip download: no wheel of ") and reason.endswith(
            "for this Python and platform (offline?)"), reason
        assert root.resolve(f"{tag}/wheels.txt") == Unavailable(404, reason)
        clock.now += 599
        assert root.resolve(f"{tag}/wheels.txt") == Unavailable(404, reason)
        clock.now += 1
        assert root.resolve(f"{tag}/wheels.txt").status == 503  # tried again
    finally:
        root.close()


@pytest.mark.slow
def test_served_for_an_image_it_builds_ahead_what_its_nodes_ask_for(
        caplog: pytest.LogCaptureFixture) -> None:
    """The box's nodes boot this machine's python3: its wheelhouse is built at once; a
    standard image whose Python the agent cannot run is one warning, and nothing built for
    it."""
    from elasticslice.pilots.wheelroot import serve_for_image
    publisher = TarballPublisher().start()
    roots = []
    try:
        root, url = serve_for_image(publisher, image_urn=None, cm_local=True)
        roots.append(root)
        assert url.startswith(publisher.base_url) and url.endswith("/wheelhouse/")
        assert root.wheelhouse(timeout=240).python == this_python()
        old, _ = serve_for_image(publisher, cm_local=False, image_urn=(
            "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU20-64-STD"))
        roots.append(old)
        assert any("nodes of urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU20-64-STD: "
                   "no wheelhouse for Python 3.8 on manylinux_2_31_x86_64: the node agent "
                   "needs Python 3.10 or later" in r.getMessage() for r in caplog.records)
        assert old.wheelhouse(timeout=240).python == this_python()
        assert f"ready=['{OWN}']" in repr(old)
    finally:
        publisher.stop()
        for root in roots:
            root.close()


@pytest.mark.slow  # builds this machine's wheelhouse ahead, unless cached
def test_over_tls_it_shows_a_control_certificate_of_the_cluster_ca_on_a_kept_port(
        tmp_path: Path) -> None:
    """``serve_for_image(ca=...)``: the root on an HTTPS publisher of its own (member
    ``wheelhouse`` of the cluster CA, OU control), on the port the last process used, which
    :meth:`close` stops."""
    import ssl

    from elasticslice.pilots.ca import ClusterCA
    from elasticslice.pilots.wheelroot import serve_for_image
    ca = ClusterCA.open(tmp_path / "pki")
    keep = tmp_path / "wheelhouse.json"
    context = ssl.create_default_context(cafile=str(ca.ca_file))
    publisher = TarballPublisher().start()
    try:
        ports = []
        for _ in range(2):
            root, url = serve_for_image(publisher, image_urn=None, cm_local=False, ca=ca,
                                        keep=keep, token="t" * 32)
            try:
                assert url == f"https://127.0.0.1:{root.port}/{'t' * 32}/wheelhouse/"
                with pytest.raises(urllib.error.HTTPError) as answer:
                    urllib.request.urlopen(url + "cp39-manylinux_2_35_x86_64/wheels.txt",
                                           timeout=10, context=context)
                assert answer.value.read() == b"the node agent needs Python 3.10 or later\n"
                ports.append(root.port)
            finally:
                root.close()
            with pytest.raises(urllib.error.URLError):  # stopped with the root
                urllib.request.urlopen(url, timeout=10, context=context)
        assert ports[0] == ports[1]
        assert publisher.published() == 0  # nothing of the root on the plain publisher
    finally:
        publisher.stop()
