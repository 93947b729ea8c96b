"""The abstract manager of the seed, and the state wrapper the manager uses."""
from __future__ import annotations

from typing import Any

from elasticslice.managers.helpers import ElasticSliceHelper
from elasticslice.managers.state import ManagerState


class TrackedState:
    """The manager's :class:`ManagerState`, counting the writes that change what the policy
    sees (nodes, notices, values, intents), so the policy's view of a large slice is built
    again only when one happened. Everything else passes through."""

    OBSERVED_WRITES = frozenset({"upsert_node", "mark_gone", "add_pending_delete",
                                 "finish_pending_delete", "forget_pending_delete",
                                 "release_pending_delete", "force_pending_delete",
                                 "expire_pending_deletes", "set_values", "begin_intent",
                                 "finish_intent"})

    def __init__(self, state: ManagerState) -> None:
        self.inner = state
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.OBSERVED_WRITES:
            return attr

        def write(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            try:
                return attr(*args, **kwargs)
            finally:
                self.writes += 1
        return write


class ElasticSliceManager(ElasticSliceHelper):
    """The abstract manager: a helper too (the seed's OO style, so that a subclass may
    override the helper methods); subclasses implement the cycle methods."""

    def __init__(self, server: Any, config: Any = None) -> None:
        ElasticSliceHelper.__init__(self, server, config)

    def _abstract(self, name: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement {name}")

    def create_slice(self) -> Any:
        return self._abstract("create_slice")

    def create_sliver(self, cm: Any = None) -> Any:
        return self._abstract("create_sliver")

    def ensure_slice(self) -> Any:
        return self._abstract("ensure_slice")

    def ensure_sliver(self, cm: Any = None) -> Any:
        return self._abstract("ensure_sliver")

    def update_sliver_status(self, cm: Any = None) -> Any:
        return self._abstract("update_sliver_status")

    def update_all(self, cm: Any = None) -> Any:
        return self._abstract("update_all")

    def update_available(self, cm: Any = None) -> Any:
        return self._abstract("update_available")

    def get_system_state(self) -> Any:
        return None

    def set_system_state(self) -> Any:
        return None

    def add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        return self._abstract("add_nodes")

    def should_add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        return None

    def delete_nodes(self, cm: Any = None) -> Any:
        return self._abstract("delete_nodes")

    def should_delete_nodes(self, cm: Any = None) -> Any:
        return None

    def manage(self) -> None:
        self._abstract("manage")

    def manage_once(self, force: bool = False) -> Any:
        return self._abstract("manage_once")
