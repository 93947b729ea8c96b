"""The Parsl daemon's end of the channel (:class:`~elasticslice.parsl.remote.RemoteBlocks`),
tried as a workload process a task took over would: what it sends is checked before the
daemon uses it (a worker command that points the nodes elsewhere, a key folder that is not
the executor's, a frame of the pilots' protocol), each refused with one line; and the
blocks, their nodes, the drains, as a provider sees them, through the real socket."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from elasticslice import channel as ch
from elasticslice.managers.records import PendingDelete
from elasticslice.parsl.blocks import BlockBook, BlockState
from elasticslice.parsl.remote import RemoteBlocks
from tests.helpers import wait_for

KEYS = "/local/parsl/curve"


class Daemon:
    """A RemoteBlocks on ``state_dir`` and what it was told."""

    def __init__(self, state_dir: Path) -> None:
        self.book = BlockBook()
        self.keys: list[Path] = []
        self.closed: list[bool] = []
        self.remote = RemoteBlocks(
            state_dir, self.book, address="10.1.2.3", margin=1.0,
            states_of=lambda ids: ["ready"] * len(ids), on_blocks=lambda: None,
            on_close=self.closed.append, on_keys=self.keys.append).start()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remote.stop()


def block(job_id: str = "j1", command: str = f"pool --cert_dir {KEYS} --block_id=0",
          nodes: list[str] | None = None) -> dict[str, Any]:
    return {"job_id": job_id, "name": "b", "command": command, "size": 2, "block_id": "0",
            "state": "live", "nodes": nodes or []}


def refused(state_dir: Path, kind: str, **fields: Any) -> str:
    """Attach, send one frame, and return why the daemon closed the connection."""
    done, why = threading.Event(), []
    link = ch.connect(state_dir, on_message=lambda m: None,
                      on_close=lambda reason: (why.append(reason), done.set()))
    link.send(kind, **fields)
    assert done.wait(10), "the daemon kept the connection"
    return str(why[0])


@pytest.mark.parametrize("frame, line", [
    (dict(blocks=[block(command="pool --cert_dir /home/me/.ssh --block_id=0")]),
     f"j1: a node's worker pool reads its keys from {KEYS} only"),
    (dict(blocks=[block(command=f"pool --cert_dir {KEYS} --cert_dir /tmp --block_id=0")]),
     f"j1: a node's worker pool reads its keys from {KEYS} only"),
    (dict(blocks=[block(command="pool --cert_dir None -a 10.1.2.3 --block_id=0")]),
     "encrypted=False) would serve Parsl's interchange in the clear on 10.1.2.3"),
    (dict(blocks=[], key_dir="/etc"), "key_dir '/etc' is not an executor's key folder"),
    (dict(blocks=[], key_dir="relative/keys"), "is not an executor's key folder"),
])
def test_what_a_taken_over_provider_sends_is_refused_in_one_line(
        tmp_path: Path, frame: dict[str, Any], line: str) -> None:
    with Daemon(tmp_path) as daemon:
        why = refused(tmp_path, "blocks", **frame)
        assert line in why and "\n" not in why, why
        assert daemon.book.blocks == {} and daemon.keys == []
        # the daemon goes on: the next provider attaches and is heard
        wait_for(lambda: not daemon.remote.attached, what="the bad provider let go")
        link = ch.connect(tmp_path, on_message=lambda m: None)
        link.send("blocks", blocks=[block()])
        wait_for(lambda: "j1" in daemon.book.blocks, what="the block heard")
        link.close()


def test_a_pilots_frame_is_not_a_parsl_providers(tmp_path: Path) -> None:
    with Daemon(tmp_path):
        assert "pilots: not something a Parsl provider sends" in refused(
            tmp_path, "pilots", pilots=[])


def test_the_key_folder_must_be_the_executors(tmp_path: Path) -> None:
    folder = tmp_path / "certificates"
    folder.mkdir()
    link_path = tmp_path / "link"
    os.symlink(folder, link_path)
    with Daemon(tmp_path) as daemon:
        assert "not an executor's key folder" in refused(   # no server.key in it
            tmp_path, "blocks", blocks=[], key_dir=str(folder))
        (folder / "server.key").write_text("public")
        wait_for(lambda: not daemon.remote.attached, what="the provider let go")
        assert "not an executor's key folder" in refused(   # a link to it
            tmp_path, "blocks", blocks=[], key_dir=str(link_path))
        wait_for(lambda: not daemon.remote.attached, what="the provider let go")
        link = ch.connect(tmp_path, on_message=lambda m: None)
        link.send("blocks", blocks=[], key_dir=str(folder))
        wait_for(lambda: daemon.keys == [folder], what="the folder taken")
        link.close()


def test_blocks_nodes_and_a_drain_as_the_provider_sees_them(tmp_path: Path) -> None:
    heard: list[dict[str, Any]] = []
    with Daemon(tmp_path) as daemon:
        link = ch.connect(tmp_path, on_message=heard.append)
        # a daemon started again hears which node was whose
        link.send("blocks", blocks=[block(nodes=["parsl-1"]), block("j2")])
        wait_for(lambda: len(daemon.book.blocks) == 2, what="the blocks heard")
        first = daemon.book.get("j1")
        assert first.nodes == ["parsl-1"] and daemon.book.of("parsl-1") is first
        daemon.remote.tell()
        wait_for(lambda: heard, what="the blocks told")
        assert heard[0]["type"] == "bound" and {e["job_id"]: e["nodes"] for e in
                                                heard[0]["bound"]} == {"j1": ["parsl-1"],
                                                                       "j2": []}
        daemon.remote.tell()   # nothing changed: nothing told
        # a notice: the provider is asked to hold the block, and answers
        rev = PendingDelete(cm="cm", node_id="n1", client_id="parsl-1", deadline=10**10,
                            first_seen=0.0)
        daemon.book.drain(first, rev)
        answer: list[str] = []
        waiter = threading.Thread(target=lambda: answer.append(
            daemon.remote.wait_empty(first)))
        waiter.start()
        wait_for(lambda: any(m["type"] == "drain_block" for m in heard), what="the ask")
        ask = next(m for m in heard if m["type"] == "drain_block")
        assert (ask["job_id"], ask["until"], ask["margin"]) == ("j1", 10**10, 1.0)
        link.send("block_drained", job_id="j1", why="drained")
        waiter.join(10)
        assert answer == ["drained"]
        # a block the provider no longer lists was cancelled: its nodes go back
        link.send("blocks", blocks=[block("j2")])
        wait_for(lambda: first.state is BlockState.CANCELLED, what="j1 cancelled")
        link.send("close", give_back=True)
        wait_for(lambda: daemon.closed == [True], what="the close heard")
        link.close()
    assert json.dumps(heard)   # every frame was JSON, nothing else
