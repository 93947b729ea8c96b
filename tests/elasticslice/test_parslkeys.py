"""``elasticslice.parsl.keys``: the nodes' CurveZMQ keys in the executor's key folder, and
what the interchange allows from it (fast: no interchange, no node)."""
from __future__ import annotations

from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")


def test_the_interchange_allows_a_nodes_key_from_when_it_is_authorised_until_withdrawn(
        tmp_path: Path) -> None:
    """Broke: Parsl's authenticator read the folder once, when the interchange started
    (before any node), so no node's key was ever allowed."""
    from elasticslice.parsl.keys import AuthorisedKeys, FolderKeys, key_file
    server = zmq.curve_keypair()[0].decode()
    (tmp_path / "server.key").write_bytes(key_file(server))
    allowed, keys = FolderKeys(tmp_path), AuthorisedKeys(tmp_path)
    first, second = zmq.curve_keypair()[0], zmq.curve_keypair()[0]
    assert not allowed.callback("*", first)
    assert keys.authorise("parsl-1", first.decode()) == {"server_key": server}
    assert allowed.callback("*", first) and keys.allowed() == ["parsl-1"]
    keys.authorise("parsl-1", second.decode())   # one key a node: the new one replaces it
    assert allowed.callback("*", second) and not allowed.callback("*", first)
    assert keys.withdraw("parsl-1") and not keys.withdraw("parsl-1")
    assert not allowed.callback("*", second) and keys.allowed() == []


@pytest.mark.parametrize("key", [None, "", "x" * 39, "x" * 41, "x" * 39 + '"',
                                 "x" * 39 + "\n", b"x" * 40])
def test_only_a_curve_public_key_is_written(tmp_path: Path, key: object) -> None:
    from elasticslice.parsl.keys import AuthorisedKeys, KeyRefused
    with pytest.raises(KeyRefused, match="expected a CurveZMQ public key"):
        AuthorisedKeys(tmp_path).authorise("parsl-1", key)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 65, "a b"])
def test_a_key_file_is_named_after_a_node_name_only(tmp_path: Path, name: str) -> None:
    from elasticslice.parsl.keys import AuthorisedKeys, KeyRefused
    with pytest.raises(KeyRefused, match="not a node name"):
        AuthorisedKeys(tmp_path).authorise(name, zmq.curve_keypair()[0].decode())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("address, refused", [
    (None, True), ("0.0.0.0", True), ("198.51.100.7", True), ("::", True),
    ("127.0.0.1", False), ("::1", False), ("localhost", False)])
def test_an_unencrypted_interchange_starts_on_loopback_only(address: str | None,
                                                            refused: bool) -> None:
    from elasticslice.parsl.keys import ClearInterchange, check_interchange
    config = {"cert_dir": None, "interchange_address": address}
    if refused:
        with pytest.raises(ClearInterchange, match="unencrypted on"):
            check_interchange(config)
    else:
        check_interchange(config)
    check_interchange({**config, "cert_dir": "/run/certificates"})  # encrypted: anywhere
