"""The parts of a :class:`~.core.Manager`, built in one place, each
with the collaborators it is given (no part reaches into another), and the seed's
thresholds as read-through fields of the policy's config."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from elasticslice.managers.actuator import Actuator
from elasticslice.managers.background import Background
from elasticslice.managers.cycle import Cycle
from elasticslice.managers.endpoint import SimpleElasticSliceClientEndpoint
from elasticslice.managers.holdings import Holdings
from elasticslice.managers.hosted import HostedSystem, NodeEvents
from elasticslice.managers.notices import NoticeBook
from elasticslice.managers.observer import Observer
from elasticslice.managers.ownership import SliceClaim
from elasticslice.managers.registrar import EndpointRegistrar
from elasticslice.managers.renewer import Renewer
from elasticslice.managers.sites import Sites


class PolicyField:
    """A seed attribute of the manager whose one place is the policy's config: reading it
    reads ``manager.policy``, setting it replaces ``manager.policy`` (the next decision
    uses it)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, manager: Any, owner: type | None = None) -> Any:
        return self if manager is None else getattr(manager.policy, self.name)

    def __set__(self, manager: Any, value: Any) -> None:
        manager.policy = dataclasses.replace(manager.policy, **{self.name: value})


def build_parts(manager: Any, server: Any, *, helper: Any, hosted: HostedSystem,
                endpoint: Any, delete_in_group: bool, delete_commands_timeout: float,
                adopt: bool, releaser: Any = None) -> None:
    """Give ``manager`` its parts (no I/O): the callbacks' and mail's threads, the node
    records (holdings), the notice book, the observer, the actuator, the renewer, the
    callback endpoint and its registrar (``endpoint``: an ``EndpointConfig``, None: no
    server; ``releaser``: how revoked nodes are released, None: the helper's delete
    commands), the slice claim and the cycle. ``helper`` says what a node is; the parts that
    see nodes settle or go tell it, then ``hosted`` (:class:`~.hosted.NodeEvents`)."""
    m, now = manager, manager._now
    state = m.state
    events = NodeEvents(helper, hosted)
    m.events = Background("manager-events")  # reactions to callbacks, in order
    m.mail = Background("manager-mail")
    m.holdings = Holdings(state, events, clock=now, notify=m.notify_later, post=m.events.post)
    m.notices = NoticeBook(state, holdings=m.holdings, clock=now, wake=m.wake,
                           notify=m.notify_later, calling_cm=lambda: (
                               m.registrar.calling_cm() if getattr(m, "registrar", None)
                               else None))
    m.observer = Observer(state, m.holdings, events, clock=now, notify=m.notify, wake=m.wake)
    m.actuator = Actuator(server, state, m.holdings, helper, m.cms, clock=now, notify=m.notify,
                          renew_hours=m.renew_hours,
                          delete_commands_timeout=delete_commands_timeout,
                          free=m.observer.free, wake=m.wake)
    m.renewer = Renewer(server, state, m.cms, ensure_slice=m.actuator.ensure_slice, clock=now,
                        notify=m.notify, renew_hours=m.renew_hours, margin=m._renew_margin)
    m.client_endpoint = SimpleElasticSliceClientEndpoint(
        helper, delete_in_group, book=m.notices, releaser=releaser,
        released=m._commands_finished, clock=now)
    m.registrar = EndpointRegistrar(server, m.cms, endpoint, m.client_endpoint) \
        if endpoint is not None else None
    m.claim = SliceClaim(server, state, adopt=adopt, where=str(Path(state.path).parent),
                         clock=now)
    quick = getattr(server, "fewer_retries", None)   # a CM among several: few retries
    m.sites = Sites(retry_interval=m.retry_interval, intervals=m.manage_intervals, clock=now,
                    state=state, **({"quick": quick} if quick is not None else {}))
    m.cycle = Cycle(m._run_method, order=m.manage_order, intervals=m.manage_intervals,
                    default_interval=m.DEF_INTERVAL, reset_triggers=m.method_reset_triggers,
                    retry_interval=m.retry_interval, recorder=state.cycle_log,
                    on_error=m._on_method_error, clock=now)
