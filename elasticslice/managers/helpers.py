"""Helpers: what the experiment is (the seed's API).

A helper says what the sliver looks like (:meth:`create_rspec`), what each new node is
(:meth:`get_add_args`, the CM v2 ``AddNodes`` ``nodes`` struct), what to run before a node
is given back (:meth:`get_delete_commands`), and what to do when a node became ready or
failed (:meth:`handle_added_node`) or left (:meth:`handle_deleted_node`). The manager decides
*when*; the helper decides *what*. Subclassing a helper is the main extension point::

    class MyHelper(SimpleElasticSliceHelper):
        def handle_added_node(self, node, status):
            ...

Client ids of new nodes never repeat: the manager tells the helper every client_id it has
ever seen (:meth:`ElasticSliceHelper.note_client_ids`), including nodes that are gone and
nodes of an AddNodes whose outcome is not known yet.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from elasticslice.rspec import LinkSpec, NodeSpec, add_nodes_args, build_request

log = logging.getLogger(__name__)


class ElasticSliceHelper:
    """The abstract helper: ``create_rspec`` and ``get_add_args`` must be provided by a
    subclass; the other methods default to doing nothing."""

    def __init__(self, server: Any = None, config: Any = None) -> None:
        self.server = server
        self.config = config
        self._client_ids: set[str] = set()

    # ---- bookkeeping the manager drives
    def note_client_ids(self, client_ids: Iterable[str]) -> None:
        """Client ids in use (or ever used) in the slice: new nodes must not reuse them."""
        self._client_ids.update(client_ids)

    @property
    def known_client_ids(self) -> frozenset[str]:
        return frozenset(self._client_ids)

    # ---- the seed's interface
    def create_rspec(self) -> str:
        """The request RSpec (XML text) of the sliver, used only when it does not exist."""
        raise NotImplementedError("this helper cannot create an rspec")

    def get_add_args(self, count: int = 1) -> dict[str, dict[str, Any]]:
        """``count`` new nodes as the CM v2 ``AddNodes`` ``nodes`` struct
        ``{client_id: {diskimage, startup, tarballs, lans, node}}`` (CloudLab's CM reads
        these five: ``startup`` one command string, run with ``/bin/sh``; ``tarballs`` URL
        strings, each installed at ``/``; ``lans`` LAN names; ``node`` a physical node
        name). A node may also wish for a ``hardware_type``: the manager asks for it as
        ``node`` = a free node of that type from the CM's advertisement (CloudLab's AddNodes
        has no hardware type) and never sends the key."""
        raise NotImplementedError("this helper cannot add nodes")

    def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        """Shell commands run serially (in a child process) before ``nodelist`` is given
        back; each item has at least ``node_id``, ``client_id``, ``max_wait_time``."""
        return []

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        """``node`` (``{client_id, node_id, hostname, cm}``) became ``ready`` or ``failed``."""
        return None

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        """``node`` (``{client_id, node_id, cm}``) left the slice."""
        return None


_SUFFIX = re.compile(r"-(\d+)$")


class SimpleElasticSliceHelper(ElasticSliceHelper):
    """A default helper: ``num_pcs`` raw PCs named ``<node_prefix>-<n>``, each with
    ``image_urn``, ``nodetype`` (hardware type: in the sliver's RSpec, and for added nodes
    a free node of that type by name), ``tarballs`` ((url, install path) pairs; added nodes
    take ``/`` only, as CloudLab's AddNodes installs them) and ``startup_command`` (one
    command, run with ``/bin/sh``: printable ASCII, at most 255 characters, no ``'``, ``<``
    or ``&``, which would break the CM's AddNodes XML); ``num_lans`` LANs
    ``<lan_prefix>-<n>`` joined by every node (``multiplex_lans``: link multiplexing on)."""

    def __init__(self, server: Any = None, config: Any = None, num_pcs: int = 1,
                 image_urn: str | None = None, num_lans: int = 0, multiplex_lans: bool = False,
                 tarballs: Sequence[tuple[str, str]] | Sequence[Sequence[str]] = (),
                 startup_command: str | None = None, nodetype: str | None = None,
                 node_prefix: str = "node", lan_prefix: str = "lan") -> None:
        # not super(): in seed 004's FooManager(SimpleElasticSliceHelper,
        # SimpleElasticSliceManager) the next class is the manager, which wants a state
        ElasticSliceHelper.__init__(self, server, config)
        if num_pcs < 1:
            raise ValueError(f"num_pcs must be at least 1, not {num_pcs}")
        self.num_pcs = num_pcs
        self.image_urn = image_urn
        self.num_lans = max(0, num_lans)
        self.multiplex_lans = multiplex_lans
        self.tarballs = [(str(t[0]), str(t[1])) for t in tarballs]
        self.startup_command = startup_command
        self.nodetype = nodetype
        self.node_prefix = node_prefix
        self.lan_prefix = lan_prefix

    @property
    def lan_names(self) -> list[str]:
        return [f"{self.lan_prefix}-{i}" for i in range(1, self.num_lans + 1)]

    def node_spec(self, client_id: str) -> NodeSpec:
        """The specification of one node (override to vary nodes)."""
        return NodeSpec(
            client_id=client_id, hardware_type=self.nodetype, disk_image=self.image_urn,
            interfaces=[(f"{client_id}:if{i}", None, None) for i in range(self.num_lans)],
            installs=list(self.tarballs),
            executes=[("sh", self.startup_command)] if self.startup_command else [])

    def next_client_ids(self, count: int) -> list[str]:
        """``count`` fresh client ids after the highest ``<node_prefix>-<n>`` ever seen."""
        prefix = f"{self.node_prefix}-"
        highest = 0
        for cid in self._client_ids:
            if cid.startswith(prefix):
                match = _SUFFIX.search(cid)
                if match:
                    highest = max(highest, int(match.group(1)))
        return [f"{prefix}{highest + i}" for i in range(1, count + 1)]

    def create_rspec(self) -> str:
        names = self.next_client_ids(self.num_pcs)
        self.note_client_ids(names)
        nodes = [self.node_spec(name) for name in names]
        links = [LinkSpec(client_id=lan,
                          interfaces=[f"{name}:if{i}" for name in names],
                          link_multiplexing=True if self.multiplex_lans else None)
                 for i, lan in enumerate(self.lan_names)]
        return build_request(nodes, links)

    def get_add_args(self, count: int = 1) -> dict[str, dict[str, Any]]:
        if count < 1:
            return {}
        names = self.next_client_ids(count)
        self.note_client_ids(names)
        specs = [self.node_spec(name) for name in names]
        for spec in specs:  # with AddNodes the LANs are named; no interfaces are needed
            spec.interfaces = []
        return add_nodes_args(specs, lans=self.lan_names)

    def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        return []


class PluginElasticSliceHelper(ElasticSliceHelper):
    """A helper that calls another helper (``set_helper``): what a manager that does not
    know its experiment mixes in."""

    def __init__(self, server: Any = None, config: Any = None,
                 helper: ElasticSliceHelper | None = None) -> None:
        ElasticSliceHelper.__init__(self, server, config)
        self.helper = helper

    def set_helper(self, helper: ElasticSliceHelper) -> None:
        self.helper = helper
        helper.note_client_ids(self._client_ids)

    def _require(self) -> ElasticSliceHelper:
        if self.helper is None:
            raise NotImplementedError("no helper set (call set_helper)")
        return self.helper

    def note_client_ids(self, client_ids: Iterable[str]) -> None:
        ids = list(client_ids)
        super().note_client_ids(ids)
        if self.helper is not None:
            self.helper.note_client_ids(ids)

    def create_rspec(self) -> str:
        return self._require().create_rspec()

    def get_add_args(self, count: int = 1) -> dict[str, dict[str, Any]]:
        return self._require().get_add_args(count)

    def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        return self.helper.get_delete_commands(nodelist) if self.helper else []

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        if self.helper is not None:
            self.helper.handle_added_node(node, status)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        if self.helper is not None:
            self.helper.handle_deleted_node(node)
