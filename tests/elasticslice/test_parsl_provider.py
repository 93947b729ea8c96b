"""``CloudLabProvider``: Parsl's HighThroughputExecutor on the box's nodes.

Fast tests: the node-state mapping and the argument checks. Slow tests (the box, real Parsl,
real worker pools on emulated nodes): a workflow of python apps runs through the provider,
survives a revocation mid-run with the right results, and the revoked block's node goes back
early. Apps wait on a gate of a :class:`~tests.elasticslice.pilots.helpers.Witness` (nodes
share the host's loopback), so the test says when work may end, whatever the machine's load.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from elasticslice.managers.policy import NodeState
from tests.elasticslice.managers.helpers import admin, cm_nodes, reclaim_outcome
from tests.elasticslice.parslbox import cm_nodes_or_none, managers_of, parsl_on_box
from tests.hostile.netstat import listening, reachable_from_outside
from tests.helpers import untar, wait_for

R, N, F = NodeState.READY, NodeState.NOTREADY, NodeState.FAILED


class _Parsl:
    """``elasticslice.parsl`` and Parsl's ``JobState``, imported when a test first uses
    them: importing Parsl costs ~0.4 s of CPU, in each of the suite's workers that collect
    this module, most of which run none of its tests."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):   # pytest's collection asks every module global for
            raise AttributeError(name)  # ``_mock_name`` (pytest 9): that is not a use
        import elasticslice.parsl
        from parsl.jobs.states import JobState
        value = JobState if name == "JobState" else getattr(elasticslice.parsl, name)
        setattr(self, name, value)
        return value


P = _Parsl()


# ---------------------------------------------------------------------- the mapping (fast)
@pytest.mark.parametrize("block, nodes, slots, expected", [
    ("LIVE", [], 1, "PENDING"),              # nothing asked for yet
    ("LIVE", [N], 0, "PENDING"),             # booting
    ("LIVE", [NodeState.CHANGING, N], 0, "PENDING"),
    ("LIVE", [N, R], 0, "RUNNING"),          # one node up is enough
    ("LIVE", [R, None], 0, "RUNNING"),       # one taken, one left
    ("LIVE", [None, None], 0, "TIMEOUT"),    # all taken without notice
    ("LIVE", [F], 0, "FAILED"),              # never booted
    ("LIVE", [F, N], 0, "PENDING"),
    ("DRAINING", [R], 0, "HELD"),            # a notice: no new task
    ("DRAINED", [None], 0, "COMPLETED"),
    ("DRAINED", [R], 0, "COMPLETED"),
    ("CANCELLED", [R], 0, "CANCELLED"),
])
def test_node_states_map_to_parsl_job_states(block: str, nodes: list[Any], slots: int,
                                             expected: str) -> None:
    assert P.job_state(P.BlockState[block], nodes, slots) is P.JobState[expected]


def test_the_documented_table_is_the_mapping(repo_root: Path) -> None:
    text = (repo_root / "docs" / "parsl.md").read_text()
    for state in ("PENDING", "RUNNING", "HELD", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"):
        assert re.search(rf"\|[^\n]*`{state}`", text), state


# ---------------------------------------------------------------------- arguments (fast)
@pytest.mark.parametrize("options, message", [
    ({}, "needs the CloudLab client"),
    ({"server": object(), "config": "x.conf"}, "one of them"),
    ({"server": object(), "nodes_per_block": 0}, "nodes_per_block must be a whole number >= 1"),
    ({"server": object(), "max_blocks": True}, "max_blocks must be a whole number"),
    ({"server": object(), "min_blocks": 3, "max_blocks": 2}, "max_blocks must be a whole "
                                                             "number >= 3"),
    ({"server": object(), "init_blocks": 5, "max_blocks": 2}, "init_blocks (5) is more than"),
    ({"server": object(), "parallelism": 2}, "parallelism must be between 0 and 1"),
    ({"server": object(), "margin": -1}, "margin must be a number of seconds >= 0"),
    ({"server": object(), "status_polling_interval": 0}, "status_polling_interval must be"),
    ({"server": object(), "label": "a b"}, "label must be letters"),
    ({"server": object(), "cores_per_node": "8"}, "cores_per_node must be a whole number"),
    ({"server": object(), "node_python": "python3\nrm -rf /"}, "node_python must be the "
                                                              "image's Python command"),
])
def test_bad_arguments_are_one_clear_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(P.ProviderError) as err:
        P.CloudLabProvider(**options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unencrypted_executor_is_refused_beyond_loopback_before_anything_starts(
        tmp_path: Path) -> None:
    """Broke: encrypted=False was required, on the address that routes to the CM."""
    provider = P.CloudLabProvider(server=object(), state_dir=tmp_path / "state",
                                  listen="10.1.2.3")
    for command in ("process_worker_pool.py -a 10.1.2.3 --cert_dir None --block_id=0",
                    "process_worker_pool.py -a 127.0.0.1,10.1.2.3 --block_id=0",
                    "process_worker_pool.py --cert_dir None --block_id=0"):
        with pytest.raises(P.ProviderError, match=r"encrypted=False\).* on 10\.1\.2\.3,") as err:
            provider.submit(command, 1, "parsl.cloudlab.block-0")
        assert "\n" not in str(err.value)
    with pytest.raises(P.ProviderError, match="no server.key") as err:  # not Parsl's folder
        provider.submit(f"process_worker_pool.py --cert_dir {tmp_path} --block_id=0", 1, "b")
    assert provider.link is None and not (tmp_path / "state").exists()
    # loopback only: the pool's command as the nodes run it is Parsl's, unchanged
    local = P.CloudLabProvider(server=object(), listen="127.0.0.1")
    command = "process_worker_pool.py -a 127.0.0.1 --cert_dir None --block_id=0"
    assert local._node_command(command) == command


def test_a_manager_daemon_that_cannot_start_is_one_line_and_nothing_is_made(
        tmp_path: Path) -> None:
    """The daemon reads the config (the credentials are its own): a config it cannot read
    fails the first submit with its line, and no state directory is made."""
    provider = P.CloudLabProvider(config=tmp_path / "nope.conf", state_dir=tmp_path / "state",
                                  listen="127.0.0.1")
    with pytest.raises(P.ProviderError, match=r"^CloudLabProvider: .*nope\.conf: config file "
                                              r"not found") as err:
        provider.submit("process_worker_pool.py -a 127.0.0.1 --block_id=0", 1, "b")
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)
    provider.close()
    assert not (tmp_path / "state").exists() and provider.link is None


def test_an_encrypted_pool_runs_with_the_nodes_own_key_folder(tmp_path: Path) -> None:
    from parsl import curvezmq
    cert_dir = curvezmq.create_certificates(tmp_path)
    provider = P.CloudLabProvider(server=object(), listen="10.1.2.3")
    command = provider._node_command(f"process_worker_pool.py -a 10.1.2.3 --cert_dir "
                                     f"{cert_dir} --block_id=0")
    assert command == ("process_worker_pool.py -a 10.1.2.3 --cert_dir /local/parsl/curve "
                       "--block_id=0")
    assert provider.keys is not None and provider.keys.cert_dir == Path(cert_dir)


def test_the_provider_says_what_parsl_asks_of_it() -> None:
    provider = P.CloudLabProvider(server=object(), label="cl", nodes_per_block=2,
                                  init_blocks=0, min_blocks=0, max_blocks=3, parallelism=0.5,
                                  status_polling_interval=1.5)
    assert (provider.label, provider.status_polling_interval, provider.nodes_per_block,
            provider.init_blocks, provider.min_blocks, provider.max_blocks,
            provider.parallelism, provider.max_nodes) == ("cl", 1.5, 2, 0, 0, 3, 0.5, 6)
    assert provider.status(["nosuch"])[0].state is P.JobState.UNKNOWN
    assert provider.cancel(["nosuch"]) == [False]


def test_the_interchange_address_is_where_the_nodes_reach_this_machine(tmp_path: Path) -> None:
    """``provider.address`` (what the executor's ``address`` must be): ``listen``, else the
    config's ``[pilots] listen`` (the box's control address: its nodes cannot reach this
    machine's 127.0.0.1), else loopback for a CM on this machine. Broke: 127.0.0.1 always."""
    conf = tmp_path / "c.conf"
    (tmp_path / "user.pem").write_text("not read here\n")
    (tmp_path / "ca.pem").write_text("not read here\n")
    base = ("[protogeni]\ncertificate = user.pem\nca_bundle = ca.pem\n"
            "cm_urls = https://127.0.0.1:1/protogeni/xmlrpc/cm\nslice_name = s1\n")
    conf.write_text(base + "[pilots]\nlisten = 100.64.3.1\n")
    assert P.CloudLabProvider(config=conf).address == "100.64.3.1"
    assert P.CloudLabProvider(config=conf, listen="10.0.0.5").address == "10.0.0.5"
    conf.write_text(base)
    assert P.CloudLabProvider(config=conf).address == "127.0.0.1"


# ---------------------------------------------------------------------- blocks and nodes (fast)
def test_new_nodes_fill_the_oldest_open_block_and_a_failed_add_reopens_its_slots() -> None:
    book = P.BlockBook()
    first, second = P.Block("a", "block-0", "cmd 0", 2), P.Block("b", "block-1", "cmd 1", 1)
    book.add(first)
    book.add(second)
    assert [book.bind(c).job_id for c in ("n1", "n2", "n3")] == ["a", "a", "b"]
    assert book.bind("n4") is None and book.open_slots() == 0
    book.unbind(["n2", "n3"])  # AddNodes failed
    assert (first.nodes, second.nodes, book.open_slots()) == (["n1"], [], 2)
    assert book.wanted("n1") and not book.wanted("n2")
    book.set_state(first, P.BlockState.CANCELLED)
    assert not book.wanted("n1") and book.open_slots() == 1
    # a final block stays final
    assert not book.set_state(first, P.BlockState.LIVE)
    assert first.state is P.BlockState.CANCELLED


def decided(book: Any, held: dict[str, dict[str, Any]], *, most: int = 4, adding: int = 0,
            now: float = 100.0) -> Any:
    """The stock policy's decision on the nodes ``held`` (client_id -> NodeView fields) as
    the Parsl manager shows them to it (its ``BlockWatch``, its policy's knobs)."""
    import dataclasses

    from elasticslice.managers.policy import (Availability, NodeView, Observed, PolicyConfig,
                                              decide)
    from elasticslice.parsl.manager import PARSL_POLICY, BlockWatch
    policy = dataclasses.replace(PolicyConfig(
        minthreshold=0, maxthreshold=most, enable_delete=True, percent_available_minimum=0.0,
        max_add_per_cycle=most, cmlist=("cm",)), **PARSL_POLICY)
    views = tuple(NodeView(client_id=cid, cm="cm", added_at=1.0, **{"state": R, **fields})
                  for cid, fields in held.items())
    watch = BlockWatch(book, clock=lambda: now)
    observed = Observed(now=now, nodes=watch.decorate(views), adding=adding,
                        availability={"cm": {"*": Availability(20, 40)}})
    observed = dataclasses.replace(observed, demand=watch.demand(observed, policy))
    return decide(observed, policy)


def test_parsls_blocks_are_demand_for_the_stock_policy() -> None:
    """Issue 35: the manager had its own add and delete rules next to the policy's; now the
    open slots of live blocks are demand, and the policy decides."""
    book = P.BlockBook()
    first, second = P.Block("a", "block-0", "cmd 0", 2), P.Block("b", "block-1", "cmd 1", 2)
    book.add(first)
    book.add(second)
    assert dict(decided(book, {}).add) == {"cm": 4}         # every open slot
    assert dict(decided(book, {}, most=3).add) == {"cm": 3}  # up to max_nodes
    for cid in ("parsl-1", "parsl-2", "parsl-3"):
        book.bind(cid)
    held = {cid: {} for cid in first.nodes + second.nodes}
    assert dict(decided(book, held).add) == {"cm": 1} and decided(book, held, adding=1).empty
    # a block drained or cancelled: its nodes go back at once, the others' stay (busy)
    book.set_state(first, P.BlockState.CANCELLED)
    decision = decided(book, held)
    assert dict(decision.delete) == {} and dict(decision.replace) == {
        "cm": ("parsl-1", "parsl-2")} and dict(decision.add) == {"cm": 1}
    # a notice drains a block: its revoked node is CloudLab's to take, its other node busy
    book.bind("parsl-4")
    book.set_state(second, P.BlockState.DRAINING)
    draining = {"parsl-3": {"pending_delete": True}, "parsl-4": {}}
    assert decided(book, draining).empty
    book.set_state(second, P.BlockState.DRAINED)   # drained: the other node goes too
    assert dict(decided(book, draining).replace) == {"cm": ("parsl-4",)}


def test_a_node_no_block_wants_goes_back_but_never_the_slivers_last() -> None:
    """The sliver's first node, its block cancelled while it was the only node; then Parsl
    asks for a block again. Counted as idle, that node would be room for the new block,
    which cannot use it: the new block would never get a node."""
    book = P.BlockBook()
    old = P.Block("a", "block-0", "cmd 0", 1)
    book.add(old)
    book.bind("parsl-1")
    book.set_state(old, P.BlockState.CANCELLED)
    first = {"parsl-1": {"initial": True}}
    assert decided(book, first).empty          # CloudLab keeps a sliver's last node
    book.add(P.Block("b", "block-1", "cmd 1", 1))
    decision = decided(book, first)
    assert dict(decision.add) == {"cm": 1} and not decision.replace
    book.bind("parsl-2")
    decision = decided(book, {**first, "parsl-2": {"state": N}})
    assert dict(decision.replace) == {"cm": ("parsl-1",)} and not decision.add


def test_slots_free_again_when_their_add_failed_but_not_while_it_may_still_come() -> None:
    from types import SimpleNamespace as NS
    book = P.BlockBook()
    block = P.Block("a", "block-0", "cmd 0", 3)
    book.add(block)
    for cid in ("parsl-1", "parsl-2", "parsl-3"):
        book.bind(cid)
    held, adding = {"parsl-1"}, [NS(kind="add", client_ids=["parsl-2"])]  # its answer lost
    from elasticslice.parsl.manager import ParslSystem
    blocks = NS(book=book, manager=NS(cmlist=["cm"], state=NS(
        open_intents=lambda: adding, node=lambda url, cid: NS() if cid in held else None)))
    ParslSystem.adds_done(blocks)   # after add_nodes, or a failed ensure_sliver
    assert (block.nodes, book.open_slots()) == (["parsl-1", "parsl-2"], 1)


def test_a_node_given_back_after_it_failed_to_start_keeps_its_block_failed() -> None:
    """The policy gives back an added node that failed to start; its block stays FAILED
    (not TIMEOUT, which says CloudLab took its nodes)."""
    from types import SimpleNamespace as NS

    from elasticslice.parsl.daemon import node_state
    records = {"parsl-1": NS(state="failed", gone_at=5.0), "parsl-2": NS(state="ready",
                                                                         gone_at=5.0)}
    state = NS(node=lambda url, cid: records.get(cid))   # the daemon's
    assert [node_state(state, ["cm"], c) for c in ("parsl-1", "parsl-2", "parsl-3")] == [
        F, None, N]   # failed, taken, being added
    # the provider's process hears them in the daemon's ``bound`` frame
    provider = P.CloudLabProvider(server=object())
    provider.book.add(P.Block("a", "block-0", "cmd 0", 1))
    provider.book.add(P.Block("b", "block-1", "cmd 1", 1))
    provider._on_bound([
        {"job_id": "a", "state": "live", "nodes": ["parsl-1"], "states": ["failed"]},
        {"job_id": "b", "state": "live", "nodes": ["parsl-2"], "states": [None]}])
    assert [s.state for s in provider.status(["a", "b"])] == [P.JobState.FAILED,
                                                               P.JobState.TIMEOUT]


def test_the_daemon_hears_the_first_block_when_it_starts(tmp_path: Path) -> None:
    """The daemon starts its manager once it heard the blocks, and the manager makes a
    sliver at each CM at once: the first block is in the first frame, so the sliver's first
    node is that block's. Broke: the first frame had no block, and every sliver's first
    node booted for no block (with two CMs, one such node stayed at each). A daemon that
    cannot start leaves no block behind."""
    from types import SimpleNamespace as NS
    provider = P.CloudLabProvider(server=object(), state_dir=tmp_path / "state",
                                  listen="127.0.0.1")
    heard: list[dict[str, Any]] = []

    def start() -> None:   # the link opens: its first frame is the blocks now
        heard.append(provider._blocks_frame())
        provider.link = NS(fatal=None, send_blocks=lambda: None)

    provider._start = start
    try:
        job = provider.submit("process_worker_pool.py -a 127.0.0.1 --block_id=0", 1, "b0")
    finally:
        provider.link = None
    assert [[b["job_id"] for b in frame["blocks"]] for frame in heard] == [[job]]

    def refused() -> None:
        raise P.ProviderError("CloudLabProvider: the manager cannot start")
    provider._start = refused
    with pytest.raises(P.ProviderError, match="cannot start"):
        provider.submit("process_worker_pool.py -a 127.0.0.1 --block_id=1", 1, "b1")
    assert list(provider.book.blocks) == [job] and provider.status([job])[0].state is \
        P.JobState.PENDING


def test_a_daemon_that_refused_the_provider_for_good_fails_its_blocks_and_new_ones(
        tmp_path: Path) -> None:
    """The daemon refused this provider for good (its link's ``fatal``): nobody holds the
    blocks' nodes any more, so their state says so, and a new block is one line, not a job
    id no node will ever serve."""
    from types import SimpleNamespace as NS
    provider = P.CloudLabProvider(server=object(), state_dir=tmp_path / "state",
                                  listen="127.0.0.1")
    provider.book.add(P.Block("a", "block-0", "cmd 0", 1))
    provider.link = NS(fatal="the manager cannot start: its state is another slice's")
    try:
        (status,) = provider.status(["a"])
        assert status.state is P.JobState.FAILED and "its state is another slice's" in \
            status.message
        with pytest.raises(P.ProviderError, match="^CloudLabProvider: the manager cannot "
                                                  "start: its state is another slice's"):
            provider.submit("process_worker_pool.py -a 127.0.0.1 --block_id=1", 1, "b")
    finally:
        provider.link = None


def test_a_node_runs_its_blocks_command_in_the_environment_it_built(tmp_path: Path) -> None:
    """start.sh, run by a real sh: it finds its block's command in the slice's tarball under
    its name (geni-get's), the environment's lines set py, the worker pool's name runs this
    Python's module, and the block's command runs as given (quoted once); after a reboot
    (the tarball unchanged, its nodes' files taken) it runs the command it kept."""
    from elasticslice.pilots.publish import TarballPublisher
    publisher = TarballPublisher().start()
    try:
        helper = P.ParslNodeHelper(P.BlockBook(), publisher, tmp_path / "tarballs",
                                   f"py={sys.executable}\n", cores=3)
        block = P.Block("a", "block-0", "echo \"cores=$PARSL_CORES\"; "
                        "process_worker_pool.py -c 'import sys; print(sys.argv[1:])' "
                        "--block_id=0", 1, block_id="0")
        helper.book.add(block)
        spec = helper.node_spec("parsl-1")
        assert spec.installs == [(helper.tarball_url(), "/")]
        import tarfile
        with tarfile.open(helper.slice_tarball.path) as tar:
            untar(tar, tmp_path / "node")
    finally:
        publisher.stop()
    here = tmp_path / "node" / "local" / "parsl"
    script = here / "start.sh"
    script.write_text(script.read_text().replace("here=/local/parsl", f"here={here}"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "geni-get").write_text("#!/bin/sh\necho parsl-1\n")
    (bin_dir / "geni-get").chmod(0o755)
    # the worker pool's module stands in for what the node's environment holds
    fake = tmp_path / "parsl" / "executors" / "high_throughput"
    fake.mkdir(parents=True)
    for folder in (tmp_path / "parsl", tmp_path / "parsl" / "executors", fake):
        (folder / "__init__.py").write_text("")
    (fake / "process_worker_pool.py").write_text(
        "import sys; print('pool', sys.argv[1:])\n")
    import shutil
    import subprocess
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    for boot in ("first", "reboot"):
        done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60,
                              env=env)
        assert done.returncode == 0, (boot, done.stderr)
        assert done.stdout.splitlines() == [
            "cores=3", "pool ['-c', 'import sys; print(sys.argv[1:])', '--block_id=0']"], boot
        shutil.rmtree(here / "nodes", ignore_errors=True)
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": "/usr/bin:/bin"})  # no geni-get
    assert done.returncode == 1 and done.stderr.strip().endswith("geni-get client_id failed")


def test_an_encrypted_node_enrols_and_has_its_own_key_authorised_before_its_pool_runs(
        tmp_path: Path) -> None:
    """start.sh of an encrypted block, run by a real sh: the node takes its token, enrols
    (its TLS key made here), makes its CurveZMQ pair and has the public key authorised at
    the enrolment service with its worker certificate, then runs the pool with its own key
    folder; after a reboot (no token left) it runs with the key it kept."""
    import shutil
    import subprocess
    import tarfile

    from parsl import curvezmq

    from elasticslice.parsl.keys import AuthorisedKeys
    from elasticslice.pilots.ca import ClusterCA
    from elasticslice.pilots.enrol import EnrolmentService
    from elasticslice.pilots.publish import TarballPublisher
    ca = ClusterCA.open(tmp_path / "pki")
    keys = AuthorisedKeys(Path(curvezmq.create_certificates(tmp_path / "run")))
    service = EnrolmentService(ca, is_held=lambda cid: True, on_key=keys.authorise).start()
    publisher = TarballPublisher().start()
    try:
        helper = P.ParslNodeHelper(P.BlockBook(), publisher, tmp_path / "tarballs",
                                   f"py={sys.executable}\n", ca=ca, enrolment=service,
                                   enrol_url=service.url)
        helper.book.add(P.Block("a", "block-0", "process_worker_pool.py --cert_dir "
                                "/local/parsl/curve --block_id=0", 1, block_id="0"))
        helper.node_spec("parsl-1")
        with tarfile.open(helper.slice_tarball.path) as tar:
            untar(tar, tmp_path / "node")
        here = tmp_path / "node" / "local" / "parsl"
        assert not list(here.rglob("*.key_secret"))  # no CurveZMQ key in the tarball
        script = here / "start.sh"
        script.write_text(script.read_text().replace("here=/local/parsl", f"here={here}"))
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "geni-get").write_text("#!/bin/sh\necho parsl-1\n")
        (bin_dir / "geni-get").chmod(0o755)
        pool = tmp_path / "fake" / "parsl" / "executors" / "high_throughput"
        pool.mkdir(parents=True)
        for folder in (pool.parent.parent, pool.parent, pool):
            (folder / "__init__.py").write_text("")
        (pool / "process_worker_pool.py").write_text(
            "import sys; print('pool', sys.argv[1:])\n")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin",
               "PYTHONPATH": f"{tmp_path / 'fake'}:{Path(__file__).resolve().parents[2]}"}
        for boot in ("first", "reboot"):
            done = subprocess.run(["sh", str(script)], capture_output=True, text=True,
                                  timeout=120, env=env)
            assert done.returncode == 0, (boot, done.stderr)
            assert done.stdout.splitlines() == [
                "pool ['--cert_dir', '/local/parsl/curve', '--block_id=0']"], boot
            assert (service.enrolled, keys.allowed()) == (1, ["parsl-1"]), boot
            assert not (here / "token").exists() and not (here / "nodes").exists()
            assert (here / "curve" / "client.key_secret").stat().st_mode & 0o777 == 0o600
            assert keys.server_key() in (here / "curve" / "server.key_secret").read_text()
        shutil.rmtree(here / "curve")   # a node that lost its key has no token left
        done = subprocess.run(["sh", str(script)], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 1 and done.stderr.strip().endswith(
            "no enrolment token for parsl-1 in the tarball and no key in "
            f"{here}/curve"), done.stderr
    finally:
        publisher.stop()
        service.stop()


def test_the_nodes_wheelhouse_with_parsl_is_one_of_its_own(tmp_path: Path) -> None:
    from elasticslice.pilots.wheelhouse import Wheelhouse, WheelhouseError
    with pytest.raises(WheelhouseError, match="expected names, e.g. parsl"):
        Wheelhouse.for_python(root=tmp_path, extra=("../parsl",))
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------- on the box (slow)


@pytest.mark.slow
def test_a_workflow_survives_a_revocation_and_the_block_goes_back_early(
        emulator_factory: Any, tmp_path: Path) -> None:
    emulator = emulator_factory(max_wait=120, notify_interval=0.3)
    with parsl_on_box(emulator, tmp_path, nodes_per_block=2) as box:
        provider, executor = box.provider, box.executor
        squares = [box.square(i, box.gate.url) for i in range(6)]
        block = box.running_block()  # a task on each of its two nodes
        victim, sibling = block.nodes
        # the interchange is encrypted: each node's own key was authorised after it enrolled
        assert executor.encrypted and set(block.nodes) <= set(provider.keys.allowed())
        node_ids = {cid: box.node_id(cid) for cid in block.nodes}
        admin(emulator).call("Revoke", nodes=[node_ids[victim]])
        wait_for(lambda: provider.status([block.job_id])[0].state is P.JobState.HELD,
                 timeout=60, what="the block held (draining)")
        # the block's managers, on both nodes, are held at the interchange: no new task
        # reaches them
        wait_for(lambda: not any(m["active"] for m in managers_of(executor, block.block_id)),
                 timeout=60, what="the block's managers held")
        # Parsl's strategy asks for a block in its place (a held block is not active)
        wait_for(lambda: len(provider.book.blocks) >= 2, timeout=60, what="a second block")
        # nothing of the provider, the executor or the nodes listens beyond this machine
        assert reachable_from_outside({ip for ip, _ in listening(os.getpid(), children=True)}) == set()
        box.gate.open()
        results = [f.result(timeout=240) for f in squares]
        assert [r[0] for r in results] == [i * i for i in range(6)]
        assert box.total(*squares).result(timeout=120) == sum(i * i for i in range(6))
        # the block's nodes ran what they had before the notice, and nothing after
        ran = [r[1] for r in results]
        assert (ran.count(victim), ran.count(sibling)) == (1, 1), results
        wait_for(lambda: reclaim_outcome(emulator, node_ids[victim]), timeout=120,
                 what="the reclamation to end")
        assert reclaim_outcome(emulator, node_ids[victim]) == "early"
        # the block's other node went back with it
        wait_for(lambda: not set(block.nodes) & set(cm_nodes(emulator, tmp_path)), timeout=60,
                 what="the block's nodes given back")
        # the daemon tells the provider's process (within its half-second sync)
        wait_for(lambda: provider.status([block.job_id])[0].state is P.JobState.COMPLETED,
                 timeout=30, what="the block completed")
        # the nodes given back: their keys are allowed no more (the manager's event thread
        # withdraws them once it recorded the nodes gone)
        wait_for(lambda: not set(block.nodes) & set(provider.keys.allowed()), timeout=60,
                 what="the given-back nodes' keys withdrawn")
        stats = provider.stats()
        assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
            (1, 1, 0), stats
    # the provider closed: the slice went back
    assert cm_nodes_or_none(emulator, tmp_path) is None


# A node taken without notice (its tasks retried by Parsl on another block's node) is a step
# of tests/hostile/test_parsl_interchange.py's test on the box: one box and Parsl fewer.


@pytest.mark.slow
def test_a_block_asked_for_after_the_last_was_cancelled_gets_a_node_of_its_own(
        emulator_factory: Any, tmp_path: Path) -> None:
    """The sliver's only node, its block cancelled, stays (CloudLab keeps a sliver's last
    node). Then the provider dies; a provider started on the same state directory stops the
    daemon it left (keeping the nodes) and starts its own; a block it asks for gets a node
    of its own, and the old node goes back. The blocks' commands stand in for Parsl's
    worker pool (no Parsl loaded here)."""
    import socket

    from parsl import curvezmq

    from tests.elasticslice.managers.helpers import FAST_INTERVALS, client_for
    from tests.elasticslice.pilots.helpers import pilot_image
    emulator = emulator_factory()
    server = client_for(emulator, tmp_path / "cache")

    def new_provider() -> Any:
        return P.CloudLabProvider(server, tmp_path / "state", disk_image=pilot_image(emulator),
                                  node_python="python3", status_polling_interval=0.5,
                                  intervals={**FAST_INTERVALS, "renew": 600.0})

    provider = new_provider()
    cert_dir = curvezmq.create_certificates(tmp_path / "run")

    def running(job_id: str) -> bool:
        return provider.status([job_id])[0].state is P.JobState.RUNNING

    try:
        first = provider.submit(f"sleep 600; : --cert_dir {cert_dir} --block_id=0", 1, "b0")
        wait_for(lambda: running(first), timeout=120, what="the first block running")
        (old,) = provider.book.get(first).nodes
        # its start script done: enrolled, its key allowed, the block's command running
        wait_for(lambda: old in provider.keys.allowed(), timeout=120, what="its key allowed")
        assert provider.cancel([first]) == [True]
        wait_for(lambda: provider.status([first])[0].state is P.JobState.CANCELLED,
                 timeout=30, what="the block cancelled")
        assert cm_nodes(emulator, tmp_path) == [old]
        # the provider dies: its connection to the daemon ends without a word, as a SIGKILL
        # of its process leaves it; the daemon keeps the node for a provider to come back
        dead, daemon = provider.link, provider.daemon_pid
        dead._stop.set()
        dead.channel.sock.shutdown(socket.SHUT_RDWR)
        provider.link = None   # (nothing of the dead one tells the daemon anything more)
        provider = new_provider()
        second = provider.submit(f"sleep 600; : --cert_dir {cert_dir} --block_id=1", 1, "b1")
        from tests.helpers import process_alive
        assert provider.daemon_pid not in (None, daemon)
        wait_for(lambda: not process_alive(daemon), timeout=30, what="the old daemon gone")
        wait_for(lambda: running(second), timeout=120, what="the second block running")
        (new,) = provider.book.get(second).nodes
        wait_for(lambda: cm_nodes(emulator, tmp_path) == [new], timeout=60,
                 what="the cancelled block's node given back")
    finally:
        provider.close()
        server.close()
    assert cm_nodes_or_none(emulator, tmp_path) is None
