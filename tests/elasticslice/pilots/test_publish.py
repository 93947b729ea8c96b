"""The publisher: files and whole directories at unguessable URLs without a query string,
under the base URL the CM fetches from (``public_url``), nothing outside what was given."""
from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticslice.pilots.publish import PublishError, TarballPublisher, Unavailable, new_token
from elasticslice.rspec.tarball import tarball_problem


@pytest.fixture
def publisher() -> Iterator[TarballPublisher]:
    made = TarballPublisher().start()
    yield made
    made.stop()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "wheelhouse"
    (root / "simple" / "dask").mkdir(parents=True)
    (root / "dask-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (root / "simple" / "dask" / "index.html").write_text("<a href='x'>x</a>")
    (root / ".hidden").write_text("no")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "link").symlink_to(tmp_path / "secret.txt")
    return root


def test_a_tree_is_served_read_only_under_an_unguessable_prefix(publisher: TarballPublisher,
                                                                tree: Path) -> None:
    url = publisher.publish_tree(tree, "wheelhouse")
    assert url.startswith(publisher.base_url + "/") and url.endswith("/wheelhouse/")
    assert "?" not in url and len(url.split("/")[3]) >= 32
    assert fetch(url + "dask-1.0-py3-none-any.whl") == b"wheel"
    assert b"dask/index.html" not in fetch(url + "simple/dask/")  # its own index.html
    listing = fetch(url).decode()  # what pip --find-links reads
    assert 'href="dask-1.0-py3-none-any.whl"' in listing and ".hidden" not in listing
    assert status(url.rstrip("/")) == 200  # redirected to the folder
    for bad in ("../secret.txt", "%2e%2e/secret.txt", ".hidden", "link", "nothing"):
        assert status(url + bad) == 404, bad
    guessed = publisher.base_url + "/wheelhouse/dask-1.0-py3-none-any.whl"
    assert status(guessed) == 404
    publisher.withdraw(url)
    assert status(url + "dask-1.0-py3-none-any.whl") == 404 and publisher.published() == 0


def test_urls_are_rooted_at_the_public_url_and_still_served_here(tmp_path: Path) -> None:
    (tmp_path / "a.tar.gz").write_bytes(b"gz")
    publisher = TarballPublisher(public_url="http://control.example.org:8080/").start()
    try:
        url = publisher.publish(tmp_path / "a.tar.gz", "node-1.tar.gz")
        assert url.startswith("http://control.example.org:8080/") and tarball_problem(url) is None
        path = url.removeprefix("http://control.example.org:8080")
        assert fetch(publisher.base_url + path) == b"gz"  # behind the public address
        tree_url = publisher.publish_tree(tmp_path, "files")
        assert tree_url.startswith("http://control.example.org:8080/")
        publisher.withdraw(url)
        publisher.withdraw(tree_url)
        assert status(publisher.base_url + path) == 404 and publisher.published() == 0
    finally:
        publisher.stop()


@pytest.mark.parametrize("bad", ["ftp://h/", "http://h/?x=1", "h:80", "file:///tmp"])
def test_a_public_url_that_cannot_be_fetched_from_is_refused(bad: str) -> None:
    with pytest.raises(PublishError, match="public_url"):
        TarballPublisher(public_url=bad)


def test_stop_withdraws_everything(publisher: TarballPublisher, tree: Path) -> None:
    publisher.publish_tree(tree, "wheelhouse")
    assert publisher.published() == 1
    publisher.stop()
    assert publisher.published() == 0


def test_a_tree_that_is_not_a_directory_or_a_bad_name_is_refused(publisher: TarballPublisher,
                                                               tree: Path) -> None:
    with pytest.raises(PublishError, match="not a directory"):
        publisher.publish_tree(tree / "dask-1.0-py3-none-any.whl", "x")
    with pytest.raises(PublishError, match="letters, digits"):
        publisher.publish_tree(tree, "a b")


def test_a_resolver_serves_what_it_finds_and_says_why_it_cannot(publisher: TarballPublisher,
                                                                tree: Path) -> None:
    asked: list[str] = []

    def resolve(path: str) -> Path | Unavailable | None:
        asked.append(path)
        if path.startswith("building/"):
            return Unavailable(503, "being built\nfor you", retry_after=2.5)
        if path.startswith("missing/"):
            return Unavailable(404, "no wheelhouse for Python 3.9 on aarch64")
        return tree.joinpath(*path.split("/")) if path else tree

    url = publisher.publish_resolver("wheels", resolve)
    assert url.endswith("/wheels/") and len(url.split("/")[3]) >= 32
    assert fetch(url + "dask-1.0-py3-none-any.whl") == b"wheel"
    assert 'href="dask-1.0-py3-none-any.whl"' in fetch(url).decode()
    with pytest.raises(urllib.error.HTTPError) as err:
        fetch(url + "building/wheels.txt")
    assert err.value.code == 503 and err.value.headers["Retry-After"] == "3"
    assert err.value.read() == b"being built for you\n"  # one line
    with pytest.raises(urllib.error.HTTPError) as err:
        fetch(url + "missing/wheels.txt")
    assert err.value.code == 404 and b"Python 3.9 on aarch64" in err.value.read()
    assert status(url + ".hidden") == 404 and status(url + "a/../../x") == 404
    assert ".hidden" not in asked and not any(".." in p for p in asked)
    publisher.withdraw(url)
    assert status(url + "dask-1.0-py3-none-any.whl") == 404 and publisher.published() == 0


def test_a_given_token_keeps_the_url_across_publishers(tmp_path: Path) -> None:
    """A restarted control node serves the nodes' tarball at the URL the CM already has."""
    (tmp_path / "slice.tar.gz").write_bytes(b"v1")
    token = new_token()
    first = TarballPublisher().start()
    try:
        url = first.publish(tmp_path / "slice.tar.gz", "slice.tar.gz", token=token)
        port = first.port_bound
    finally:
        first.stop()
    again = TarballPublisher(port=port).start()
    try:
        assert again.publish(tmp_path / "slice.tar.gz", "slice.tar.gz", token=token) == url
        (tmp_path / "slice.tar.gz").write_bytes(b"v2")  # read at each request
        assert fetch(url) == b"v2"
        with pytest.raises(PublishError, match="16-64 letters"):
            again.publish(tmp_path / "slice.tar.gz", "x.tar.gz", token="short")
    finally:
        again.stop()
