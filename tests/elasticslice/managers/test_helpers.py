"""Helpers (the seed's API) and the README's helper example, run against the emulator."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from elasticslice.managers import (ElasticSliceHelper, PluginElasticSliceHelper,
                                   SimpleElasticSliceHelper)
from elasticslice.rspec import nodespecs_from_add_args, parse, validate
from tests.helpers import REPO, wait_for


def test_simple_helper_rspec_validates_and_has_what_was_asked() -> None:
    helper = SimpleElasticSliceHelper(
        num_pcs=2, image_urn="urn:publicid:IDN+emulab.net+image+emulab-ops:UBUNTU22-64-STD",
        num_lans=1, multiplex_lans=True, tarballs=[("http://127.0.0.1/t.tgz", "/local")],
        startup_command="/local/run.sh", nodetype="m510", node_prefix="w", lan_prefix="net")
    text = helper.create_rspec()
    assert validate(text) == []
    rspec = parse(text)
    assert [n.client_id for n in rspec.nodes] == ["w-1", "w-2"]
    node = rspec.nodes[0]
    assert node.hardware_type == "m510" and node.disk_image.endswith("UBUNTU22-64-STD")
    assert node.installs == [("http://127.0.0.1/t.tgz", "/local")]
    assert node.executes == [("sh", "/local/run.sh")]
    assert [link.client_id for link in rspec.links] == ["net-1"]
    assert rspec.links[0].link_multiplexing is True


def test_add_args_never_reuse_a_client_id_and_are_valid_addnodes_args() -> None:
    helper = SimpleElasticSliceHelper(num_lans=1, startup_command="echo hi")
    helper.note_client_ids(["node-1", "node-7", "other-99"])
    args = helper.get_add_args(2)
    assert list(args) == ["node-8", "node-9"]
    assert args["node-8"] == {"startup": "echo hi", "lans": ["lan-1"]}
    assert [s.client_id for s in nodespecs_from_add_args(args)] == ["node-8", "node-9"]
    assert list(helper.get_add_args(1)) == ["node-10"]
    assert helper.get_add_args(0) == {}


def test_abstract_helper_says_what_is_missing() -> None:
    helper = ElasticSliceHelper()
    with pytest.raises(NotImplementedError, match="rspec"):
        helper.create_rspec()
    with pytest.raises(NotImplementedError, match="add nodes"):
        helper.get_add_args(1)
    assert helper.get_delete_commands([]) == []
    assert helper.handle_added_node({}, "ready") is None


def test_plugin_helper_calls_the_helper_it_was_given() -> None:
    seen: list[tuple[str, Any]] = []

    class Recording(SimpleElasticSliceHelper):
        def handle_added_node(self, node: dict, status: str) -> None:
            seen.append((node["client_id"], status))

        def get_delete_commands(self, nodelist: list[dict]) -> list[str]:
            return ["true"]

    plugin = PluginElasticSliceHelper()
    with pytest.raises(NotImplementedError, match="set_helper"):
        plugin.get_add_args(1)
    plugin.note_client_ids(["node-3"])
    plugin.set_helper(Recording())
    assert list(plugin.get_add_args(1)) == ["node-4"]  # ids noted before set_helper count
    plugin.handle_added_node({"client_id": "node-4"}, "ready")
    assert seen == [("node-4", "ready")]
    assert plugin.get_delete_commands([{"node_id": "pc1"}]) == ["true"]


def test_the_readme_helper_example_runs(emulator, tmp_path: Path, monkeypatch,
                                        capsys) -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## The elastic slice manager"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's manager section has no python block"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELASTICSLICE_CONFIG", str(emulator.config_path))
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))
    namespace: dict[str, Any] = {"__name__": "readme_manager"}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert "ready: ['node-1', 'node-2', 'node-3']" in capsys.readouterr().out
    # The tarball was unpacked on each node and its command ran there.
    wait_for(lambda: len(list(emulator.dir.glob("nodes/*/root/local/exp/ran-here"))) == 3,
             what="the startup command on 3 nodes")
