"""The manager composed (issue 35): a plain :class:`Manager` built from parts passed in, the
seed's classes a facade over it, and the pilots' and Parsl's managers assembled from parts,
not subclasses of the facade overriding its methods."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import elasticslice.managers as managers
from elasticslice.managers import HostedSystem, Manager, SimpleElasticSliceHelper
from elasticslice.managers import SimpleElasticSliceManager
from elasticslice.managers.policy import Observed, PolicyConfig
from tests.elasticslice.managers.helpers import (FAST_INTERVALS, FAST_POLICY, client_for,
                                                 cm_nodes, with_policy)
from tests.helpers import wait_for


def assembled() -> list[type]:
    from elasticslice.parsl.manager import ParslSliceManager
    from elasticslice.pilots.manager import PilotSliceManager
    return [PilotSliceManager, ParslSliceManager]


@pytest.mark.parametrize("cls", assembled(), ids=lambda c: c.__name__)
def test_the_pilots_and_parsl_managers_are_assembled_not_overridden(cls: type) -> None:
    """Neither subclasses the seed's facade, nor redefines a method of the plain manager:
    what they change comes in as parts (``hosted``, ``releaser``)."""
    assert issubclass(cls, Manager) and not issubclass(cls, SimpleElasticSliceManager)
    plain = {name for name, value in vars(Manager).items()
             if callable(value) or isinstance(value, property)}
    overridden = sorted((plain & set(vars(cls))) - {"__init__"})
    assert overridden == []
    assert "hosted" in inspect.signature(Manager).parameters


def test_the_seed_classes_are_where_seed_004_documents_them() -> None:
    """Seed 004 names ``elasticslice.managers.core.SimpleElasticSliceManager`` and the
    other classes of the seed there."""
    import elasticslice.managers.core as core
    for name in ("ElasticSliceClientEndpoint", "SimpleElasticSliceClientEndpoint",
                 "ElasticSliceHelper", "PluginElasticSliceHelper", "SimpleElasticSliceHelper",
                 "ElasticSliceManager", "SimpleElasticSliceManager"):
        assert getattr(core, name) is getattr(managers, name)
    with pytest.raises(AttributeError, match="NoSuchManager"):
        core.NoSuchManager  # noqa: B018 - the attribute is the test


class FooManager(SimpleElasticSliceHelper, SimpleElasticSliceManager):
    """Seed 004's style: the helper first, so its methods win by method resolution order,
    and this class's own override wins over both."""

    def __init__(self, server: Any, **options: Any) -> None:
        SimpleElasticSliceHelper.__init__(self, server, num_pcs=1, node_prefix="foo")
        SimpleElasticSliceManager.__init__(self, server, **options)
        self.asked: list[int] = []
        self.settled: list[tuple[str, str]] = []

    def get_add_args(self, count: int = 1) -> dict[str, dict[str, Any]]:
        self.asked.append(count)
        return SimpleElasticSliceHelper.get_add_args(self, count)

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        self.settled.append((node["client_id"], status))


def test_a_seed_style_subclass_is_its_own_helper(emulator, tmp_path: Path) -> None:
    """The facade passes itself to the plain manager as the helper: the RSpec and the new
    nodes are the subclass's (``foo-*``), and it hears them settle."""
    with client_for(emulator, tmp_path / "cache") as server:
        manager = FooManager(server, maxthreshold=2, manage_intervals=FAST_INTERVALS,
                             retry_interval=0.2, policy=FAST_POLICY,
                             state_dir=tmp_path / "state")
        try:
            assert manager.node_helper is manager and manager.helper is None
            manager.start()
            wait_for(lambda: len(manager.settled) == 2, timeout=60, what="both nodes settled")
        finally:
            manager.close()
    assert sorted(cm_nodes(emulator, tmp_path)) == ["foo-1", "foo-2"]
    assert manager.asked and sum(manager.asked) == 1   # the sliver's first node is the RSpec's
    assert sorted(manager.settled) == [("foo-1", "ready"), ("foo-2", "ready")]


class Recording(HostedSystem):
    """A hosted system of a user's own: says how many nodes its work wants, hears the nodes
    settle and go, and is told which idle nodes go before they do."""

    def __init__(self) -> None:
        self.want = 3
        self.events: list[tuple[str, str]] = []
        self.going: list[str] = []

    def observe(self, observer: Any, demand: int | None) -> Observed:
        return observer.observe(demand=self.want)

    def wanted(self, policy: PolicyConfig, demand: int | None) -> int | None:
        return self.want

    def node_added(self, node: dict[str, Any], status: str) -> None:
        self.events.append(("added", node["client_id"]))

    def node_deleted(self, node: dict[str, Any]) -> None:
        self.events.append(("deleted", node["client_id"]))

    def before_give_back(self, client_ids: list[str]) -> None:
        self.going.extend(client_ids)


def test_a_hosted_system_drives_the_stock_manager(emulator, make_manager,
                                                  tmp_path: Path) -> None:
    """Its demand is what the policy decides on (3 nodes, then 1), it hears each node
    settle and go, and is told of each victim before the victim is given back."""
    hosted = Recording()
    manager = make_manager(emulator, maxthreshold=4, enable_delete=True, hosted=hosted,
                           policy=with_policy(max_delete_per_cycle=2))
    manager.start()
    wait_for(lambda: len(hosted.events) == 3 and len(cm_nodes(emulator, tmp_path)) == 3,
             timeout=60, what="the 3 nodes the hosted system wants")
    assert manager.demand == 3 and manager.observe().demand == 3
    hosted.want = 1
    manager.wake("delete_nodes")
    wait_for(lambda: len(cm_nodes(emulator, tmp_path)) == 1 and
             sum(kind == "deleted" for kind, _ in hosted.events) == 2,
             timeout=60, what="two nodes given back")
    manager.stop()
    gone = sorted(cid for kind, cid in hosted.events if kind == "deleted")
    assert sorted(hosted.going) == gone and len(gone) == 2
    assert sorted(cid for kind, cid in hosted.events if kind == "added") == [
        "node-1", "node-2", "node-3"]
