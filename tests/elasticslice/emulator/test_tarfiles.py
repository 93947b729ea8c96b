"""Tarballs as CloudLab moves them: the CM fetches each one itself, by a URL that passes
tbsetup/tarfiles_setup's rule, before CreateSliver or AddNodes returns; a URL that fails the
rule or the fetch fails the call with BADARGS "Could not setup tarfiles: ..." and nothing
is allocated; the same URL is fetched once per sliver. (The box took file:// paths, query
strings and any loopback URL, and a tarball it could not fetch only failed its node later.)
"""
from __future__ import annotations


import pytest

from elasticslice.emulator.adminclient import AdminClient
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import NodeSpec, build_request
from tests.helpers import spare_port, wait_for
from tests.elasticslice.emulator.helpers import Session, make_tarball, ok
from tests.elasticslice.emulator.node_helpers import detail_of, node_dir

pytestmark = pytest.mark.slow


def _in_slices(emulator) -> int:
    pool = AdminClient(emulator.dir).call("Status")["pool"]
    return sum(row["slice"] for row in pool.values())


def _closed_port() -> int:
    return spare_port()  # nothing listens there, and no other test's server will


def _bad_urls(file_server, tmp_path) -> dict[str, str]:
    make_tarball(tmp_path / "local.tgz", {"x": "x"})
    make_tarball(file_server.root / "app.tgz", {"x": "x"})
    return {"file": f"file://{tmp_path / 'local.tgz'}",
            "query": f"{file_server.url}/app.tgz?v=1",
            "unreachable": f"http://127.0.0.1:{_closed_port()}/app.tgz",
            "missing": f"{file_server.url}/nosuch.tgz",
            "offline": "http://example.com/app.tgz",
            "server path": "/proj/elasticslice/app.tar.gz"}


@pytest.mark.parametrize("kind", ["file", "query", "unreachable", "missing", "offline",
                                  "server path"])
def test_a_bad_tarball_fails_create_sliver_and_add_nodes_and_allocates_nothing(
        emulator, file_server, tmp_path, kind):
    url = _bad_urls(file_server, tmp_path)[kind]
    s = Session(emulator)
    urn, cred = s.register("bad")
    rspec = build_request([NodeSpec("n1", installs=[(url, "/")])], validate=False)
    answer = s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]})
    assert answer["code"] == GeniCode.BADARGS, answer
    assert answer["output"].startswith("Could not setup tarfiles: ") and url in answer["output"]
    assert _in_slices(emulator) == 0
    assert s.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"] == \
        GeniCode.SEARCHFAILED  # no sliver either
    # and AddNodes to a sliver that exists
    urn, cred, _ = s.create("good", rspec=build_request([NodeSpec("base")]))
    answer = s.cm.AddNodes({"slice_urn": urn, "credentials": [cred],
                            "nodes": {"w1": {"tarballs": [url]}}})
    assert answer["code"] == GeniCode.BADARGS, answer
    assert answer["output"].startswith("Could not setup tarfiles: ") and url in answer["output"]
    assert _in_slices(emulator) == 1
    assert [d["client_id"] for d in s.status(urn, cred)["details"].values()] == ["base"]


def test_the_same_url_is_fetched_once_per_sliver_even_when_its_file_changes(
        emulator, file_server):
    make_tarball(file_server.root / "app.tgz", {"local/version": "one\n"})
    url = f"{file_server.url}/app.tgz"
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=build_request([NodeSpec("n1", installs=[(url, "/")])]))
    make_tarball(file_server.root / "app.tgz", {"local/version": "two\n"})  # changed
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred],
                      "nodes": {"n2": {"tarballs": [url]}}}))

    def version(client_id: str) -> str | None:
        node = detail_of(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]
        path = node_dir(emulator, node) / "root" / "local" / "version"
        return path.read_text() if path.exists() else None
    assert wait_for(lambda: version("n1"), timeout=30, what="n1 installed") == "one\n"
    assert wait_for(lambda: version("n2"), timeout=30, what="n2 installed") == "one\n"
    assert file_server.fetches == {"/app.tgz": 1}
    # a new sliver fetches it again, and sees the new file
    ok(s.cm.DeleteSlice({"slice_urn": urn, "credentials": [cred], "blocking": True,
                         "cancel": True}))
    ok(s.cm.CreateSliver({"slice_urn": urn, "credentials": [cred],
                          "rspec": build_request([NodeSpec("n1", installs=[(url, "/")])])}))
    assert wait_for(lambda: version("n1"), timeout=30, what="n1 installed") == "two\n"
    assert file_server.fetches == {"/app.tgz": 2}


def test_an_addnodes_url_path_pair_is_installed_at_its_path_as_an_extension(
        emulator, file_server):
    make_tarball(file_server.root / "app.tgz", {"bin/run": "#!/bin/sh\n"})
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred],
                      "nodes": {"w1": {"tarballs": [[f"{file_server.url}/app.tgz",
                                                     "/opt/app"]]}}}))
    node = detail_of(s, urn, cred, "w1")["component_urn"].rsplit("+", 1)[-1]
    wait_for(lambda: (node_dir(emulator, node) / "root/opt/app/bin/run").exists(), timeout=30,
             what="the tarball at /opt/app")
