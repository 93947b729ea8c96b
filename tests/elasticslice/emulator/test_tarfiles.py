"""Tarballs as CloudLab moves them: the CM fetches each one itself, by a URL that passes
tbsetup/tarfiles_setup's rule, before CreateSliver, AddNodes or DeleteNodes returns, every
URL of the sliver again at every such change; a URL that fails the rule or the fetch fails
the call with BADARGS "Could not setup tarfiles: ..." and nothing changes. (The box took
file:// paths, query strings and any loopback URL, and a tarball it could not fetch only
failed its node later; then it fetched a URL once per sliver, and never on DeleteNodes.)
"""
from __future__ import annotations


import pytest

from elasticslice.emulator.adminclient import AdminClient
from elasticslice.emulator.tarfiles import TarfileStore
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


def _add(s: Session, urn: str, cred: str, nodes: dict) -> dict:
    return s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": nodes})


def _delete(s: Session, urn: str, cred: str, cids: list[str]) -> dict:
    return s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": cids})


def _cids(s: Session, urn: str, cred: str) -> set[str]:
    return {d["client_id"] for d in s.status(urn, cred)["details"].values()}


def test_every_url_the_sliver_holds_is_fetched_again_at_every_change(emulator, file_server):
    """R13 (GeniCM.pm.in SliverWorkAux runs tarfiles_setup on CreateSliver, AddNodes and
    DeleteNodes; tarfiles_setup fetches every URL of every node of the experiment) and R14
    (``%tofetch`` is keyed by URL: a URL many nodes share is one fetch; one after another).
    The box fetched a URL once per sliver, and never on DeleteNodes."""
    for name in ("a", "b"):
        make_tarball(file_server.root / f"{name}.tgz", {f"local/{name}": name})
    a, b = f"{file_server.url}/a.tgz", f"{file_server.url}/b.tgz"
    file_server.hold = 0.05  # so fetches made together would overlap
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=build_request([NodeSpec("n1", installs=[(a, "/")]),
                                                 NodeSpec("n2", installs=[(a, "/")])]))
    assert file_server.fetches == {"/a.tgz": 1}  # two nodes, one URL: one fetch
    ok(_add(s, urn, cred, {"n3": {"tarballs": [b]}}))
    assert file_server.fetches == {"/a.tgz": 2, "/b.tgz": 1}
    ok(_add(s, urn, cred, {"n4": {}, "n5": {"tarballs": [a, b]}}))
    assert file_server.fetches == {"/a.tgz": 3, "/b.tgz": 2}
    ok(_delete(s, urn, cred, ["n3", "n5"]))  # b is held by no node after it
    assert file_server.fetches == {"/a.tgz": 4, "/b.tgz": 2}
    ok(_delete(s, urn, cred, ["n4"]))
    assert file_server.fetches == {"/a.tgz": 5, "/b.tgz": 2}
    assert file_server.most_at_once == 1  # one after another


def test_a_url_that_cannot_be_fetched_any_more_fails_the_change_and_changes_nothing(
        emulator, file_server):
    """R13: a failed tarfiles step fails AddNodes and DeleteNodes alike (BADARGS "Could not
    setup tarfiles"), and nothing changes: no node added, none deleted, the kept copies as
    they were. A reclamation (the dynamic-slice server's own delete) does not run it."""
    make_tarball(file_server.root / "keep.tgz", {"local/version": "one\n"})
    make_tarball(file_server.root / "gone.tgz", {"local/gone": "x"})
    keep, gone = f"{file_server.url}/keep.tgz", f"{file_server.url}/gone.tgz"
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=build_request([
        NodeSpec("n1", installs=[(keep, "/")]), NodeSpec("n2", installs=[(gone, "/")]),
        NodeSpec("n3")]))
    kept = TarfileStore(emulator.dir).record(urn, keep)
    assert kept is not None and kept.path == TarfileStore(emulator.dir).kept(urn, keep)
    make_tarball(file_server.root / "keep.tgz", {"local/version": "two\n"})  # changed
    (file_server.root / "gone.tgz").unlink()  # and the other cannot be fetched any more
    for answer in (_add(s, urn, cred, {"n4": {}}), _delete(s, urn, cred, ["n1"])):
        assert answer["code"] == GeniCode.BADARGS, answer
        assert answer["output"].startswith("Could not setup tarfiles: ") and \
            gone in answer["output"]
    assert _cids(s, urn, cred) == {"n1", "n2", "n3"}
    assert TarfileStore(emulator.dir).record(urn, keep) == kept  # not replaced by "two"
    ok(_delete(s, urn, cred, ["n2"]))  # the node holding the URL may go: the rest refetch
    assert _cids(s, urn, cred) == {"n1", "n3"}
    now = TarfileStore(emulator.dir).record(urn, keep)
    assert now is not None and now.md5 != kept.md5 and now.changed_at >= kept.changed_at
    assert now.path == kept.path  # the same path: nodes find it there at every boot
    assert not TarfileStore(emulator.dir).kept(urn, gone).exists()  # held by no node
    # a reclamation is the dynamic-slice server's, not a client's change: no tarfiles step
    (file_server.root / "keep.tgz").unlink()
    node = detail_of(s, urn, cred, "n3")["component_urn"].rsplit("+", 1)[-1]
    AdminClient(emulator.dir).call("Revoke", nodes=[node])
    wait_for(lambda: _cids(s, urn, cred) == {"n1"}, timeout=30, what="n3 reclaimed")


def test_an_unchanged_file_keeps_its_copy_and_a_changed_one_is_installed_by_new_nodes(
        emulator, file_server):
    make_tarball(file_server.root / "app.tgz", {"local/version": "one\n"})
    url = f"{file_server.url}/app.tgz"
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=build_request([NodeSpec("n1", installs=[(url, "/")])]))
    first = TarfileStore(emulator.dir).record(urn, url)
    ok(_add(s, urn, cred, {"n2": {}}))  # fetched again, the same bytes: the copy stays
    again = TarfileStore(emulator.dir).record(urn, url)
    assert again is not None and first is not None
    assert (again.md5, again.changed_at) == (first.md5, first.changed_at)
    assert again.fetched_at >= first.fetched_at
    make_tarball(file_server.root / "app.tgz", {"local/version": "two\n"})
    ok(_add(s, urn, cred, {"n3": {"tarballs": [url]}}))

    def version(client_id: str) -> str | None:
        node = detail_of(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]
        path = node_dir(emulator, node) / "root" / "local" / "version"
        return path.read_text() if path.exists() else None
    assert wait_for(lambda: version("n3"), timeout=30, what="n3 installed") == "two\n"
    assert file_server.fetches == {"/app.tgz": 3}
