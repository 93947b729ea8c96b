"""``python -m bench.chaos.launch ELASTICSLICE-ARGUMENTS``: the ``elasticslice`` command
line itself (``run`` included) with the chaos suite's cluster tuning.

``elasticslice run`` has no options for a cluster's cycle intervals, drain margin, idle
timeout or agent timeout; a chaos run needs them short (faults every few seconds, a run in
under a minute), so this launcher adds :data:`TUNING` to every ``ElasticCluster`` the
command makes, then runs it unchanged. The emulator's client retries are set by the
environment (``ELASTICSLICE_RETRIES`` ...), as any user can.
"""
from __future__ import annotations

import functools
from typing import Any

from elasticslice.managers.policy import PolicyConfig
from elasticslice.managers.manager import SimpleElasticSliceManager

TUNING: dict[str, Any] = {
    "margin": 1.0, "idle_timeout": 3.0,
    "intervals": {m: 0.3 for m in SimpleElasticSliceManager.DEF_ORDER},
    "policy": PolicyConfig(add_cooldown=0.0, delete_cooldown=0.0, max_add_per_cycle=10,
                           max_delete_per_cycle=1),
    "manager_options": {"agent_timeout": 20.0},
}


def tune() -> None:
    """Every ``ElasticCluster`` made from now on gets :data:`TUNING`."""
    from elasticslice.pilots import cluster
    init = cluster.ElasticCluster.__init__
    if getattr(init, "chaos_tuned", False):
        return

    @functools.wraps(init)
    def tuned(self: Any, *args: Any, **options: Any) -> None:
        init(self, *args, **{**options, **TUNING})

    tuned.chaos_tuned = True  # type: ignore[attr-defined]
    cluster.ElasticCluster.__init__ = tuned  # type: ignore[method-assign]


def main() -> None:
    tune()
    from elasticslice.cli import main as elasticslice
    elasticslice()


if __name__ == "__main__":
    main()
