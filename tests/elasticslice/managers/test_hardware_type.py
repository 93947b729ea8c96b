"""A manager that wants a hardware type gets it from CloudLab's AddNodes, which has none
(protogeni/lib/GeniCMV2.pm.in ``AddNodes`` reads diskimage, startup, tarballs, lans and
node only): each new node is asked for by the name of a free node of that type, from the
CM's advertisement (DiscoverResources with ``available``). The manager sent
``hardware_type``, which CloudLab would have ignored: every node after the first of any
type the mapper liked."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from elasticslice.config import load_config
from elasticslice.errors import RPCError
from elasticslice.managers import SimpleElasticSliceHelper
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import NodeSpec, build_request
from tests.elasticslice.managers.helpers import FAST_RETRY, with_policy

pytestmark = pytest.mark.slow


def _other_slice(emulator, tmp_path: Path) -> ProtoGeniServer:
    config = load_config(emulator.config_path,
                         env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp_path / "other")})
    other = ProtoGeniServer(dataclasses.replace(config, slice_name="other"), retry=FAST_RETRY)
    other.register_slice()
    return other


def _held_types(emulator, manager) -> list[str]:
    by_id = {n.node_id: n.hardware_type for n in emulator.server.ctx.store.nodes()}
    return sorted(by_id[r.node_id] for r in manager.state.nodes())


def test_nodes_of_the_wanted_type_are_asked_for_by_the_name_of_a_free_one(
        emulator, make_manager) -> None:
    helper = SimpleElasticSliceHelper(num_pcs=1, nodetype="xl170")
    manager = make_manager(emulator, helper=helper, nodetype="xl170", maxthreshold=4)
    errors = manager.manage_once()  # the box refuses hardware_type in AddNodes
    assert not any(errors.values()), errors
    assert _held_types(emulator, manager) == ["xl170"] * 4


def test_fewer_free_than_wanted_adds_what_there_is_and_a_taken_node_is_picked_again(
        emulator, make_manager, tmp_path: Path, caplog) -> None:
    other = _other_slice(emulator, tmp_path)
    xl170s = [NodeSpec(f"o{i}", hardware_type="xl170") for i in range(8)]
    other.create_sliver(build_request(xl170s))  # 8 of the 10 xl170s
    helper = SimpleElasticSliceHelper(num_pcs=1, nodetype="xl170")
    manager = make_manager(emulator, helper=helper, nodetype="xl170", maxthreshold=4,
                           policy=with_policy(percent_available_minimum=0.0))
    for method in ("ensure_slice", "ensure_sliver", "update_available"):
        getattr(manager, method)()
    cm = manager.cms[0]
    caplog.set_level(logging.WARNING, logger="elasticslice.managers.manager")
    assert manager.actuator.add(cm, helper.get_add_args(3)) == 1  # one xl170 was left
    assert "no free node of the wanted type" in caplog.text
    assert _held_types(emulator, manager) == ["xl170"] * 2
    # The advertisement the manager read goes stale: the other slice takes every xl170.
    other.delete_slice(cancel=True, blocking=True)
    manager.update_available()
    stale = manager.observer.free.of(cm.url)["xl170"]
    assert len(stale) == 8
    other.create_sliver(build_request(xl170s))
    with pytest.raises(RPCError) as refused:
        manager.add_nodes()  # named nodes someone holds now: the CM refuses
    assert refused.value.code == GeniCode.BADARGS and "is not available" in str(refused.value)
    assert len(manager.observer.free.of(cm.url)["xl170"]) == 6  # those two are not asked again
    other.delete_slice(cancel=True, blocking=True)
    manager.update_available()  # the next cycle: a fresh advertisement, and others picked
    assert manager.add_nodes() == 2
    assert _held_types(emulator, manager) == ["xl170"] * 4
    other.close()
