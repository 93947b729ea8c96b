"""The ``dask`` pilot framework: a pilot is a Dask worker with a ``cores`` resource.

Layout. ``start()`` starts a Dask scheduler inside this process (its own event-loop thread,
127.0.0.1, port 0, no dashboard) or attaches to ``scheduler_address`` (``tcp://host:port`` or
``dask://host:port``). Each pilot is a worker *process* (``python -m troy.frameworks.dask
worker ...``) with ``resources={"cores": size}``; it reports its address on stdout once it is
registered with the scheduler (then the pilot is RUNNING, ``native_id`` = worker address) and
leaves when its stdin closes, so a dying Troy never leaks workers.

Units. By default (``unit_channel=True``) they travel on Troy's own channel, not as Dask
tasks: the framework places each one and sends it to its pilot's agent (``channel``,
``link``, ``runner``, ``wire``). What follows describes units as Dask tasks
(``unit_channel=False``), whose events, drains and losses the channel shares.
``submit_unit`` queues the unit; a submitter thread hands everything queued so far to
Dask in one ``client.map`` per (cores, pilot) group, so units submitted in a burst cost one
scheduler round instead of one each. Each unit is a Dask task (keys share one prefix,
``troy-unit-N-<topic>``: Dask keeps a task group per prefix), asking for
``resources={"cores": cores, <framework tag>: 1}``, with ``workers=[address]`` when bound
early, ``pure=False``. Dask's scheduler does the late binding. Inside the worker
``agent.run_unit`` calls ``troy.execution.execute`` and pushes two events on a topic this
framework subscribes to: ``run`` (the unit really started, with the worker's clock and
address: RUNNING is exact, not approximated from Dask's ``processing``; sent only for units
still running after 5 ms, the ``end`` event of a shorter one carries its start) and ``end``
(with the ``UnitResult`` when it is small, so no gather round trip is needed). Future
done-callbacks catch what events cannot: Dask errors, cancellations, lost keys. Dask's own
states are translated once, in ``events.DASK_FINAL``.

Modules: ``framework`` (``DaskFramework``, ``DaskPilot``), ``events`` (unit records and
state handling), ``drain`` (pilots joining and leaving: adoption, deadline-aware drains,
losses, long units kept off low-valued pilots), ``agent`` (what runs in the worker and
scheduler processes), ``processes`` (starting and stopping those processes, or a scheduler
in this process), ``schedproc`` (a scheduler in its own process: brought back on its
address when it dies, its certificate reloaded when its files change), ``tls`` (mutual
TLS), ``address`` (scheduler addresses).

Elastic pilots. Every worker carries the framework's tag as a resource (units ask for it):
our own workers from the start, workers that join on their own (node agents) once adopted,
so a worker that is not adopted never runs a unit. A drain sets the worker's tags to 0 (it
starts nothing new; the scheduler sends nothing new), requeues what it should not keep under
new Dask keys, and watches the rest (``drain``). A unit killed with its draining pilot, or
whose workers kept dying (Dask's ``KilledWorker``), is requeued, not failed.

Cancelling a running unit kills its process group on the worker (``client.run``); a Python
callable cannot be interrupted (it runs on to completion in its worker thread, its result is
dropped; the unit is CANCELED at once). Cancelling a pilot closes its worker: Dask reschedules
the late-bound units that ran there, Troy requeues the ones bound to it; a pilot whose worker
vanishes goes FAILED and its units requeue the same way (at-least-once).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The public API of the ``dask`` framework: what code outside Troy (the elastic manager,
#: a deployment of node agents) may import, from this package only; its modules are Troy's
#: insides. Each name is imported when first used: the node's enrolment and agent
#: (``python -m troy.frameworks.dask...``) run this file first and need no framework.
_WHERE = {
    "DaskFramework": "framework", "DaskPilot": "framework",
    "DaskTLS": "tls",                          # a member's TLS files (``tls=``, ``environ()``)
    "DenyList": "denylist", "serial_of": "denylist",  # certificates refused before expiry
    "RENEW_URL_ENV": "enrol",                  # the node agent's certificate renewal URL
    "cert_info": "enrol",                      # (CN, not before, not after) of a PEM file
    "EnrolError": "enrol",                     # a node's enrolment or request failed
    "tls_context": "enrol",                    # a client context pinning the cluster CA
    "post_to_control": "enrol",                # POST to the enrolment service, OU checked
    "silence_dask": "processes",               # Dask's loggers quiet in this process
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'troy.frameworks.dask' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from troy.frameworks.dask.denylist import DenyList, serial_of
    from troy.frameworks.dask.enrol import RENEW_URL_ENV, EnrolError, cert_info, post_to_control, \
        tls_context
    from troy.frameworks.dask.framework import DaskFramework, DaskPilot
    from troy.frameworks.dask.processes import silence_dask
    from troy.frameworks.dask.tls import DaskTLS
