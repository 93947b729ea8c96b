"""The demos behind ``elasticslice demo`` (``make demo``, ``bin/demo``).

``elastic``: the default, every node a pilot (needs ``elasticslice.pilots``); ``static``:
the single-machine walkthrough (``--static``); ``console``, ``report``, ``tenantload`` and
``runner``: what they share. The command itself is ``elasticslice.commands.demo``.
"""
from __future__ import annotations

from elasticslice.demo.console import DemoError, port_open, rel
from elasticslice.demo.static import DEFAULT_WORKFLOW, STEPS, Demo, DemoOptions, DemoResult

__all__ = ["DEFAULT_WORKFLOW", "STEPS", "Demo", "DemoError", "DemoOptions", "DemoResult",
           "port_open", "rel"]
