"""The elastic slice manager: keeps a slice alive, grows and shrinks it, answers CloudLab.

    from elasticslice.managers import SimpleElasticSliceManager, SimpleElasticSliceHelper

    manager = SimpleElasticSliceManager(server, maxthreshold=8, state_dir="~/.es-state",
                                        helper=SimpleElasticSliceHelper(num_pcs=2))
    manager.manage()          # or manage_once()

Helpers say what the experiment is (subclass them), the manager decides when (the seed's
classes are a facade over the plain :class:`~elasticslice.managers.core.Manager`, which the
pilots' and Parsl's managers assemble with their parts), the policy
(:func:`~elasticslice.managers.policy.decide`) decides how many, and the state store
remembers everything across restarts. See docs/manager.md.
"""
from __future__ import annotations

from elasticslice.managers.endpoint import (ElasticSliceClientEndpoint,
                                            SimpleElasticSliceClientEndpoint)
from elasticslice.managers.helpers import (ElasticSliceHelper, PluginElasticSliceHelper,
                                           SimpleElasticSliceHelper)
from elasticslice.managers.core import Manager
from elasticslice.managers.hosted import HostedSystem
from elasticslice.managers.manager import ElasticSliceManager, SimpleElasticSliceManager
from elasticslice.managers.notify import Notifier

__all__ = ["ElasticSliceClientEndpoint", "ElasticSliceHelper", "ElasticSliceManager",
           "HostedSystem", "Manager", "Notifier", "PluginElasticSliceHelper", "SimpleElasticSliceClientEndpoint",
           "SimpleElasticSliceHelper", "SimpleElasticSliceManager"]
