"""The inventory file and the node pool (no server needed)."""
from __future__ import annotations

import pytest

from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.pool import NodeRequest, load_inventory, pick_nodes, sync_nodes
from elasticslice.emulator.store import Store
from elasticslice.errors import ConfigError
from elasticslice.rpc.codes import GeniCode


def test_shipped_inventory_matches_the_built_in_default(repo_root):
    shipped = load_inventory(repo_root / "etc" / "emulator-inventory.ini")
    assert shipped == load_inventory(None)
    assert {t: h.count for t, h in shipped.types.items()} == {"m400": 40, "m510": 20,
                                                              "xl170": 10, "d430": 8}
    assert shipped.types["d430"].cores == 16


@pytest.mark.parametrize("text, key", [
    ("[m400]\ncount = many\ncores = 8\n", "m400.count"),
    ("[m400]\ncount = 2\n", "m400.cores"),
    ("[m400]\ncount = 2\ncores = 0\n", "m400.cores"),
    ("[inventory]\ndefault_hardware_type = zz\n[m400]\ncount = 2\ncores = 2\n",
     "inventory.default_hardware_type"),
])
def test_bad_inventory_names_key_and_file(tmp_path, text, key):
    path = tmp_path / "inv.ini"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(path) in str(info.value) and key in str(info.value)


def test_pick_nodes_by_type_and_by_id(tmp_path):
    store = Store(tmp_path / "s.db").open()
    inv = load_inventory(None)
    sync_nodes(store, inv)
    picked = pick_nodes(store, inv, [NodeRequest("a", "d430"), NodeRequest("b", None),
                                     NodeRequest("c", None, "urn:publicid:IDN+x+node+hp03")])
    assert [picked[0].hardware_type, picked[2].hardware_type] == ["d430", "xl170"]
    assert picked[1].hardware_type in inv.types  # no type: any free node (test_mapper.py)
    assert picked[2].node_id == "hp03"
    with pytest.raises(GeniFault) as info:
        pick_nodes(store, inv, [NodeRequest(f"x{i}", "d430") for i in range(9)])
    assert info.value.code is GeniCode.INSUFFICIENT_NODES
    with pytest.raises(GeniFault) as info:
        pick_nodes(store, inv, [NodeRequest("a", None, "nosuch")])
    assert info.value.code is GeniCode.SEARCHFAILED
    store.close()


def test_without_namespaces_paths_of_the_nodes_tree_point_into_its_root(tmp_path):
    from elasticslice.emulator.startup import localise
    names = ["local", "usr", "tmp", "root"]   # what the node's root folder holds
    assert localise("sh /local/repo/start.sh && ls /local", names, tmp_path) == \
        f"sh {tmp_path}/local/repo/start.sh && ls {tmp_path}/local"
    assert localise("cat /localfile /x/local/y", names, tmp_path) == "cat /localfile /x/local/y"
    # the image's folders and /tmp stay the host's (no namespaces: nothing else to use)
    assert localise("/usr/bin/env ls /tmp /root", names, tmp_path) == \
        f"/usr/bin/env ls /tmp {tmp_path}/root"
