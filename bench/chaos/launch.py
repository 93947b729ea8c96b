"""``python -m bench.chaos.launch ELASTICSLICE-ARGUMENTS``: the ``elasticslice`` command
line itself (``run`` included) with the chaos suite's cluster tuning.

``elasticslice run`` has no options for a cluster's cycle intervals, drain margin, idle
timeout or agent timeout; a chaos run needs them short (faults every few seconds, a run in
under a minute), so this launcher adds :data:`TUNING` to every ``ElasticCluster`` and every
manager daemon the command makes (the run's daemon is started as ``python -m
bench.chaos.launch daemon DAEMON-ARGUMENTS``, tuned the same way), then runs it unchanged.
The emulator's client retries are set by the environment (``ELASTICSLICE_RETRIES`` ...), as
any user can.
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


def _tuned(cls: Any) -> None:
    init = cls.__init__
    if getattr(init, "chaos_tuned", False):
        return

    @functools.wraps(init)
    def tuned(self: Any, *args: Any, **options: Any) -> None:
        init(self, *args, **{**options, **TUNING})

    tuned.chaos_tuned = True  # type: ignore[attr-defined]
    cls.__init__ = tuned  # type: ignore[method-assign]


def tune() -> None:
    """Every ``ElasticCluster`` and ``ManagerDaemon`` made from now on gets :data:`TUNING`,
    and the daemons a run starts are started through this launcher."""
    from elasticslice.pilots import cluster, daemon
    _tuned(cluster.ElasticCluster)
    _tuned(daemon.ManagerDaemon)
    argv = daemon.DaemonCommand.argv
    if getattr(argv, "chaos_tuned", False):
        return

    @functools.wraps(argv)
    def through_us(self: Any, state_dir: Any) -> list[str]:
        args = argv(self, state_dir)
        at = args.index("elasticslice.pilots.daemon")
        return [*args[:at], "bench.chaos.launch", "daemon", *args[at + 1:]]

    through_us.chaos_tuned = True  # type: ignore[attr-defined]
    daemon.DaemonCommand.argv = through_us  # type: ignore[method-assign]


def main() -> None:
    import sys
    tune()
    if sys.argv[1:2] == ["daemon"]:
        from elasticslice.pilots.daemon import main as daemon
        sys.exit(daemon(sys.argv[2:]))
    from elasticslice.cli import main as elasticslice
    elasticslice()


if __name__ == "__main__":
    main()
