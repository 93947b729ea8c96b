"""The abstract manager of the seed, and the state wrapper the manager uses."""
from __future__ import annotations

from typing import Any

from elasticslice.managers.helpers import ElasticSliceHelper
from elasticslice.managers.state import ManagerState


class _Counting:
    """Passes through to ``inner``, counting the calls of ``writes`` on ``owner``."""

    def __init__(self, inner: Any, owner: TrackedState, writes: frozenset[str]) -> None:
        self._inner, self._owner, self._writes = inner, owner, writes

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self._writes:
            return attr
        owner = self._owner

        def write(*args: Any, **kwargs: Any) -> Any:
            owner.writes += 1
            try:
                return attr(*args, **kwargs)
            finally:
                owner.writes += 1
        return write


class TrackedState(_Counting):
    """The manager's :class:`ManagerState`, counting the writes that change what the policy
    sees (nodes, revocations, values, intents, nodes to give back), so the policy's view of
    a large slice is built again only when one happened. Everything else passes through."""

    OBSERVED_WRITES = frozenset({"upsert_node", "mark_gone", "set_values", "begin_intent",
                                 "finish_intent"})
    RELEASE_WRITES = frozenset({"ask", "drop"})
    REVOCATION_WRITES = frozenset({"add", "release", "force", "finish", "expire", "forget"})

    def __init__(self, state: ManagerState) -> None:
        super().__init__(state, self, self.OBSERVED_WRITES)
        self.inner = state
        self.writes = 0
        self.revocations = _Counting(state.revocations, self, self.REVOCATION_WRITES)
        self.to_release = _Counting(state.to_release, self, self.RELEASE_WRITES)


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
