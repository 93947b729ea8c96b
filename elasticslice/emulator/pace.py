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
a tarball URL      1.2 - 1.5   the tarfiles step, per distinct URL of the sliver, at every
                               CreateSliver, AddNodes and DeleteNodes: tarfiles_setup runs
                               one ``sshtb`` to the ops server per URL, where
                               fetchtar.proxy sleeps 1 s before its ``wget`` (source:
                               tbsetup/tarfiles_setup.in, fetchtar.proxy.in); the ssh and
                               wget's own time are an estimate
a refused fetch    1, 2, .. 19 wget --retry-connrefused --waitretry=30 (20 tries): a refused
                               connection is tried again after 1 s, 2 s, ... (190 s in all)
=================  ==========  =============================================================

Only the figures above change; everything else answers at once, as without a profile
(without one a tarball URL costs only its real fetch and a refused connection fails the
call at once: stricter). The delay of a call is spent before the call is handled, the
tarfiles step's outside the sliver lock: neither holds anything a callback or another call
needs. Calls, boots and fetches draw from separate seeded streams, so with ``--seed`` the
k-th AddNodes takes the same time however many nodes booted or URLs were fetched before it.
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
CLOUDLAB_FETCH = (1.2, 1.5)  # one fetchtar.proxy over ssh: sleep(1), then wget
WGET_TRIES = 20              # wget's default --tries
WGET_WAITRETRY = 30.0        # --waitretry=30: 1 s, 2 s, ... up to 30 s between tries
STREAMS = ("call", "boot", "fetch")


@dataclass
class Latency:
    """How long calls and boots take: ``none`` (at once; boots take ``--boot-delay``) or
    ``cloudlab`` (the table of the module docstring, times ``time_scale``)."""

    profile: str = "none"
    time_scale: float = 1.0
    seed: int | None = None
    _rngs: dict[str, random.Random] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown latency profile {self.profile!r} (known: "
                              f"{', '.join(PROFILES)})", key="latency")
        if not self.time_scale > 0:
            raise ConfigError(f"time scale must be above 0, not {self.time_scale}",
                              key="time-scale")
        self._rngs = {kind: random.Random(None if self.seed is None else f"{self.seed}:{kind}")
                      for kind in STREAMS}

    def _draw(self, kind: str, low: float, high: float) -> float:
        with self._lock:
            return self._rngs[kind].uniform(low, high) * self.time_scale

    def call_seconds(self, method: str) -> float:
        """How long ``method`` takes before it is handled (0: at once)."""
        if self.profile != "cloudlab" or method not in CLOUDLAB_CALLS:
            return 0.0
        return self._draw("call", *CLOUDLAB_CALLS[method])

    def boot_seconds(self) -> float | None:
        """A node's boot time (None: the emulator's ``--boot-delay``)."""
        if self.profile != "cloudlab":
            return None
        return self._draw("boot", *CLOUDLAB_BOOT)

    def fetch_seconds(self) -> float:
        """What one tarball URL's fetchtar.proxy costs before its fetch (0: nothing)."""
        if self.profile != "cloudlab":
            return 0.0
        return self._draw("fetch", *CLOUDLAB_FETCH)

    def refused_waits(self) -> list[float]:
        """The waits before each new try of a fetch whose connection was refused (wget
        --retry-connrefused --waitretry=30, 20 tries); none without a profile."""
        if self.profile != "cloudlab":
            return []
        return [min(float(k), WGET_WAITRETRY) * self.time_scale for k in range(1, WGET_TRIES)]

    def pause(self, method: str) -> None:
        """Spend ``method``'s time (the dispatcher's hook)."""
        seconds = self.call_seconds(method)
        if seconds > 0:
            time.sleep(seconds)
