"""The manager against the emulator: it grows, stops growing, gives back, renews, reconciles."""
from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from elasticslice.managers import SimpleElasticSliceManager
from elasticslice.rpc.credential import expires_of
from tests.helpers import wait_for
from tests.elasticslice.managers.helpers import (POOL, admin, client_for, cm_nodes, load,
                                                with_policy)

def test_grows_to_maxthreshold_while_available(emulator, make_manager, tmp_path: Path) -> None:
    manager = make_manager(emulator, maxthreshold=5)
    errors = manager.manage_once()
    assert not any(errors.values()), errors
    assert sorted(cm_nodes(emulator, tmp_path)) == [f"node-{i}" for i in range(1, 6)]
    # Another cycle at the maximum adds nothing.
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 5
    held = {n.client_id: n for n in manager.state.nodes()}
    assert sorted(held) == [f"node-{i}" for i in range(1, 6)]
    assert held["node-1"].initial and not held["node-5"].initial
    assert all(n.node_id for n in held.values())


def test_setting_the_seeds_maxthreshold_changes_what_the_policy_decides(
        emulator, make_manager, tmp_path: Path) -> None:
    """Issue 35: the thresholds live in the policy's config alone; the seed's attributes
    read and write through to it."""
    manager = make_manager(emulator, maxthreshold=2)
    assert (manager.minthreshold, manager.maxthreshold) == (1, 2)
    assert "maxthreshold" not in vars(manager) and "minthreshold" not in vars(manager)
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 2
    manager.maxthreshold = 4
    assert manager.policy.maxthreshold == 4
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 4
    manager.minthreshold = 3
    assert manager.policy.minthreshold == 3 and manager.maxthreshold == 4
    assert manager.enable_delete is False and manager.percent_available_minimum == 0.5
    manager.enable_delete, manager.percent_available_minimum = True, 0.25
    assert (manager.policy.enable_delete, manager.policy.percent_available_minimum) == \
        (True, 0.25)
    assert not {"enable_delete", "percent_available_minimum"} & set(vars(manager))


def test_stops_growing_when_other_tenants_load_the_cm(emulator, make_manager,
                                                       tmp_path: Path) -> None:
    load(emulator, POOL - 20)  # 20 of 70 free: under percent_available_minimum 0.5
    manager = make_manager(emulator, maxthreshold=8)
    manager.manage_once()
    assert cm_nodes(emulator, tmp_path) == ["node-1"]  # the sliver, nothing more
    assert "available" in " ".join(manager.last_decision.reasons)
    load(emulator, 0)
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 8


def test_gives_nodes_back_when_enable_delete_and_availability_drops(
        emulator, make_manager, tmp_path: Path) -> None:
    manager = make_manager(emulator, maxthreshold=5, enable_delete=True,
                           policy=with_policy(max_delete_per_cycle=2))
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 5
    load(emulator, POOL - 5 - 10)  # 10 free of 70: far below 0.5 - hysteresis
    manager.manage_once()
    after_one = cm_nodes(emulator, tmp_path)
    assert len(after_one) == 3  # at most max_delete_per_cycle per cycle
    for _ in range(3):
        manager.manage_once()
    # Down to minthreshold, and the initial node stays.
    assert cm_nodes(emulator, tmp_path) == ["node-1"]
    gone = [n for n in manager.state.nodes(include_gone=True) if n.gone_at is not None]
    assert sorted(n.client_id for n in gone) == ["node-2", "node-3", "node-4", "node-5"]


def test_does_not_give_back_without_enable_delete(emulator, make_manager,
                                                  tmp_path: Path) -> None:
    manager = make_manager(emulator, maxthreshold=3)
    manager.manage_once()
    load(emulator, POOL - 3 - 5)
    manager.manage_once()
    assert len(cm_nodes(emulator, tmp_path)) == 3


def test_renews_slice_and_sliver_before_they_expire(emulator, make_manager,
                                                    tmp_path: Path) -> None:
    # A slice of 6 minutes; renew anything closer than an hour to its end.
    manager = make_manager(emulator, maxthreshold=1, renew_hours=0.1, renew_margin=3600,
                           manage_intervals={"renew": 60})
    manager.manage_once()
    look = client_for(emulator, tmp_path / "look")
    now = dt.datetime.now(dt.timezone.utc)
    slice_end = expires_of(look.get_slice_credential())
    sliver_end = expires_of(look.cm().get_sliver())
    assert slice_end > now + dt.timedelta(hours=1)
    assert sliver_end > now + dt.timedelta(hours=1)
    assert manager.state.slice().expires == slice_end.timestamp()
    assert manager.cycle.methods["renew"].last_error is None
    look.close()


def test_getsliver_is_asked_again_only_when_the_sliver_may_have_changed(
        emulator, make_manager, tmp_path: Path, monkeypatch) -> None:
    """Each GetSliver has the CM sign a new credential: while the sliver answers
    SliverStatus, a cycle does not ask it again. It asks once the state's expiry was written
    since (a renewal writes what it asked), after ``SLIVER_RECHECK``, and once SliverStatus
    finds the sliver gone, which makes it anew."""
    from elasticslice.managers import keeper
    manager = make_manager(emulator, maxthreshold=2, renew_hours=0.1, renew_margin=3600)
    cm = manager.cms[0]
    asked: list[str] = []
    get_sliver = cm.get_sliver

    def counted() -> str:
        asked.append("GetSliver")
        return get_sliver()
    cm.get_sliver = counted
    manager.manage_once()   # SEARCHFAILED, then CreateSliver
    manager.manage_once()   # the sliver's credential read
    assert len(asked) == 2
    for _ in range(3):
        assert not any(manager.manage_once().values())
    assert len(asked) == 2
    # the state's expiry written since (as the renewer writes what it asked): read again
    row = manager.state.slivers()[0]
    manager.state.set_sliver(row.cm, row.urn, row.expires - 60, row.status)
    assert not any(manager.manage_once().values())
    assert len(asked) == 3
    look = client_for(emulator, tmp_path / "look")
    truth = expires_of(look.cm().get_sliver()).timestamp()
    assert manager.state.slivers()[0].expires == truth
    assert not any(manager.manage_once().values())
    assert len(asked) == 3
    monkeypatch.setattr(keeper, "SLIVER_RECHECK", 0.0)
    manager.manage_once()
    assert len(asked) == 4
    monkeypatch.undo()
    # The sliver goes behind the manager's back (the portal's Terminate): SliverStatus fails
    # and wakes ensure_sliver, which makes the sliver again.
    look.delete_slice(cancel=True, blocking=True)
    errors = manager.manage_once()
    assert "SEARCHFAILED" in (errors["update_sliver_status"] or "")
    assert not any(manager.manage_once().values())
    assert len(cm_nodes(emulator, tmp_path)) == 2
    look.close()


def test_renewal_failure_is_loud_and_retried(emulator, make_manager, tmp_path: Path,
                                             caplog) -> None:
    manager = make_manager(emulator, maxthreshold=1, renew_hours=0.1, renew_margin=3600)
    manager.manage_once()
    # The emulator's maximum slice lifetime makes the SA refuse the renewal.
    emulator.server.ctx.settings.max_slice_days = 0.001
    manager.state.set_slice(manager.state.slice().urn, manager.state.slice().expires - 3600 * 3)
    assert manager.cycle.run_method("renew") is False
    assert "RENEWAL FAILED" in caplog.text
    record = manager.state.cycle_log.records()["renew"]
    assert record.failures == 1 and "renewal failed" in record.last_error
    assert manager.cycle.backoff("renew") == manager.retry_interval


def test_restart_after_addnodes_reached_the_cm_adds_no_duplicates(
        emulator, make_manager, tmp_path: Path) -> None:
    """Killed after the CM took an AddNodes but before its answer was recorded."""
    first = make_manager(emulator, maxthreshold=3)
    for method in ("ensure_slice", "ensure_sliver", "update_sliver_status"):
        first.cycle.run_method(method)
    args = first.get_add_args(2)
    intent = first.state.begin_intent("add", first.cmlist[0], list(args), now=first.clock())
    first.server.add_nodes(args)  # the CM has them; the manager "dies" here
    first.close()
    second = make_manager(emulator, maxthreshold=3, state_dir=tmp_path / "state")
    assert [i.id for i in second.state.open_intents()] == [intent]
    second.manage_once()
    assert sorted(cm_nodes(emulator, tmp_path)) == ["node-1", "node-2", "node-3"]
    assert not second.state.open_intents()
    assert sorted(n.client_id for n in second.state.nodes()) == ["node-1", "node-2", "node-3"]


def test_restart_after_addnodes_never_reached_the_cm(emulator, make_manager,
                                                     tmp_path: Path, caplog) -> None:
    first = make_manager(emulator, maxthreshold=3)
    for method in ("ensure_slice", "ensure_sliver"):
        first.cycle.run_method(method)
    args = first.get_add_args(2)
    died = first.clock()
    intent = first.state.begin_intent("add", first.cmlist[0], list(args), now=died)
    first.close()  # died before the call (or the CM has not carried it out yet)
    second = make_manager(emulator, maxthreshold=3, state_dir=tmp_path / "state")
    caplog.set_level(logging.INFO, logger="elasticslice.managers.manager")
    second.manage_once()
    second.manage_once()
    # Within the call timeout the CM might still add them: nothing is added meanwhile, and
    # the wait is said once, not at every cycle
    assert cm_nodes(emulator, tmp_path) == ["node-1"]
    waits = [r for r in caplog.records if "for a late AddNodes" in r.getMessage()]
    assert [r.levelno for r in waits] == [logging.INFO], waits
    assert [i.id for i in second.state.open_intents()] == [intent]
    timeout = second.server.config.timeout
    second.clock = lambda: died + timeout + 1  # ... and once it has passed
    second.manage_once()
    nodes = sorted(cm_nodes(emulator, tmp_path))
    assert len(nodes) == 3 and len(set(nodes)) == 3
    # The client_ids of the lost intent are never reused.
    assert "node-2" not in nodes and "node-3" not in nodes


def test_busy_and_503_storms_are_ridden_out(emulator_factory, make_manager,
                                            tmp_path: Path) -> None:
    emulator = emulator_factory(fault_rate=0.3, seed=8, slow_seconds=0.05)
    manager = make_manager(emulator, maxthreshold=4)
    for _ in range(20):
        manager.manage_once()
        if len(manager.state.nodes()) == 4 and not manager.state.open_intents():
            break
    faults = admin(emulator).call("Status")["faults"]
    assert faults["busy"] + faults["503"] > 0
    nodes = cm_nodes(emulator, tmp_path)
    assert len(nodes) == 4
    assert sorted(n.client_id for n in manager.state.nodes()) == sorted(nodes)


def test_seed_constants_and_defaults() -> None:
    cls = SimpleElasticSliceManager
    assert cls.DEF_INTERVAL == 60
    assert cls.DEF_MIN_THRESHOLD == 1 and cls.DEF_MAX_THRESHOLD == 10
    assert cls.DEF_ORDER[0] == "ensure_slice" and cls.DEF_ORDER[-1] == "set_system_state"
    assert cls.DEF_INTERVALS["add_nodes"] == 300 and cls.DEF_INTERVALS["renew"] == 3600
    assert cls.METHOD_RESET_TRIGGERS["add_nodes"] == [
        "update_sliver_status", "update_available", "get_system_state", "set_system_state"]
    assert "add_nodes" in cls.CM_METHODS


def test_a_policy_keeps_its_knobs_unless_a_seed_option_says_otherwise() -> None:
    """The pilots' managers (ElasticCluster, run) pass a policy keeping a quarter of a CM
    free: the seed's default of a half overwrote it."""
    from elasticslice.managers.manager import seed_options
    from elasticslice.managers.policy import PolicyConfig
    from elasticslice.pilots.managerdaemon import default_policy

    class Server:
        def cm(self, which: object) -> object:
            return which

    kept = seed_options(Server(), policy=default_policy(4), minthreshold=0, maxthreshold=4)
    assert kept["policy"].percent_available_minimum == 0.25
    assert (kept["policy"].minthreshold, kept["policy"].maxthreshold) == (0, 4)
    said = seed_options(Server(), policy=default_policy(4), percent_available_minimum=0.1)
    assert said["policy"].percent_available_minimum == 0.1
    assert seed_options(Server())["policy"] == PolicyConfig(minthreshold=1, maxthreshold=10,
                                                           percent_available_minimum=0.5)


def test_added_nodes_that_fail_to_boot_are_given_back_and_replaced(
        emulator_factory, make_manager, tmp_path: Path) -> None:
    emulator = emulator_factory(boot_failure_rate=1.0)
    manager = make_manager(emulator, maxthreshold=3)
    manager.manage_once()
    wait_for(lambda: manager.update_sliver_status() is not None and all(
        n.state == "failed" for n in manager.state.nodes()), what="failed boots")
    emulator.server.faults.boot_rate = 0.0
    manager.manage_once()  # gives node-2 and node-3 back ...
    manager.manage_once()  # ... and adds two new ones
    # node-1 (initial) is never given back, but being failed it does not count either.
    assert sorted(cm_nodes(emulator, tmp_path)) == ["node-1", "node-4", "node-5", "node-6"]
    gone = {n.client_id: n.gone_reason for n in manager.state.nodes(include_gone=True)
            if n.gone_at is not None}
    assert set(gone) == {"node-2", "node-3"}


def test_voluntary_give_back_runs_the_helpers_delete_commands_first(
        emulator, make_manager, tmp_path: Path) -> None:
    from elasticslice.managers import SimpleElasticSliceHelper

    class Marking(SimpleElasticSliceHelper):
        def get_delete_commands(self, nodelist: list[dict]) -> list[str]:
            return [f"touch {tmp_path}/bye-$ELASTICSLICE_DELETE_NODES"]

    manager = make_manager(emulator, maxthreshold=2, enable_delete=True, helper=Marking())
    manager.manage_once()
    victim = manager.state.node(manager.cmlist[0], "node-2").node_id
    load(emulator, POOL - 2 - 5)
    manager.manage_once()
    assert cm_nodes(emulator, tmp_path) == ["node-1"]
    assert (tmp_path / f"bye-{victim}").exists()
