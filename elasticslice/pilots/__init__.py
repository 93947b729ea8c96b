"""Nodes as pilots: the bridge between the CloudLab side and Troy (the only package that
imports both).

Every node the manager acquires runs a Troy node agent (a Dask worker with the node's cores
as its ``cores`` resource) that joins the control node's Dask scheduler over mutual TLS, with
a certificate from the cluster's own CA; the manager adopts it as a pilot, scales the slice to
Troy's demand, drains pilots against CloudLab's revocation deadlines and hands nodes back
early. See docs/pilots.md.

    from elasticslice.pilots import ElasticCluster

``ClusterCA`` (the CA), ``PilotElasticSliceHelper`` (the nodes' startup), ``PilotSliceManager``
(the manager), ``ElasticCluster`` (all of it in one object) and ``ClusterSnapshot``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from elasticslice import lazy

#: each public name and the module it lives in, imported when first asked for
#: (:mod:`elasticslice.lazy`): a process that needs one module of the package (the manager
#: daemon, a doctor, an enrolment, the wheelhouse) does not load all the others (0.3 s of
#: CPU at each start)
_WHERE = {"ClusterCA": "ca", "ClusterCAError": "ca", "ElasticCluster": "cluster",
          "PilotElasticSliceHelper": "helper", "PilotSliceManager": "manager",
          "Revocations": "manager", "ClusterSnapshot": "snapshot"}
__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from elasticslice.pilots.ca import ClusterCA, ClusterCAError
    from elasticslice.pilots.cluster import ElasticCluster
    from elasticslice.pilots.helper import PilotElasticSliceHelper
    from elasticslice.pilots.manager import PilotSliceManager, Revocations
    from elasticslice.pilots.snapshot import ClusterSnapshot


__getattr__, __dir__ = lazy.exports(__name__, _WHERE)
