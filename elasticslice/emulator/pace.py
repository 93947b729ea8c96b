"""CloudLab's pace, on request: ``emulator serve --latency cloudlab [--time-scale F]``.

The real CM maps and allocates inside CreateSliver and AddNodes, and physical nodes boot
(image load included) for minutes; the box answers in milliseconds by default. Under the
``cloudlab`` profile, a call takes a time drawn uniformly from its range, every range times
``--time-scale`` (0.01 makes minutes into seconds):

=================  ==========  =============================================================
what               seconds     source
=================  ==========  =============================================================
CreateSliver       10 - 40     estimate: the CM maps and allocates inside the call
                               (GeniCM.pm runs the mapper and tarfiles_setup before it
                               returns); users' reports of tens of seconds, not measured here
AddNodes           10 - 40     estimate: the same path as CreateSliver (GeniCMV2.pm)
DeleteNodes        5 - 10      estimate: the nodes are freed and their VLANs torn down before
                               it returns; not measured here
a node's boot      180 - 480   estimate: CloudLab's manual says physical nodes take "a few
                               minutes" to boot and load their image; not measured here
=================  ==========  =============================================================

Only the four figures above change; everything else answers at once, as without a profile.
The delay of a call is spent before the call is handled, holding nothing (no lock a callback
or another call needs).
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from elasticslice.errors import ConfigError

PROFILES = ("none", "cloudlab")
CLOUDLAB_CALLS = {"CreateSliver": (10.0, 40.0), "AddNodes": (10.0, 40.0),
                  "DeleteNodes": (5.0, 10.0)}
CLOUDLAB_BOOT = (180.0, 480.0)


@dataclass
class Latency:
    """How long calls and boots take: ``none`` (at once; boots take ``--boot-delay``) or
    ``cloudlab`` (the table of the module docstring, times ``time_scale``)."""

    profile: str = "none"
    time_scale: float = 1.0
    seed: int | None = None
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown latency profile {self.profile!r} (known: "
                              f"{', '.join(PROFILES)})", key="latency")
        if not self.time_scale > 0:
            raise ConfigError(f"time scale must be above 0, not {self.time_scale}",
                              key="time-scale")
        self._rng = random.Random(self.seed)

    def _draw(self, low: float, high: float) -> float:
        with self._lock:
            return self._rng.uniform(low, high) * self.time_scale

    def call_seconds(self, method: str) -> float:
        """How long ``method`` takes before it is handled (0: at once)."""
        if self.profile != "cloudlab" or method not in CLOUDLAB_CALLS:
            return 0.0
        return self._draw(*CLOUDLAB_CALLS[method])

    def boot_seconds(self) -> float | None:
        """A node's boot time (None: the emulator's ``--boot-delay``)."""
        if self.profile != "cloudlab":
            return None
        return self._draw(*CLOUDLAB_BOOT)

    def pause(self, method: str) -> None:
        """Spend ``method``'s time (the dispatcher's hook)."""
        seconds = self.call_seconds(method)
        if seconds > 0:
            time.sleep(seconds)
