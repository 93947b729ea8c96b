"""Seeded fault injection: some calls answer BUSY, HTTP 503 or slowly; some boots fail.

With ``rate`` p, each call is hit with probability p, the kind of hit drawn evenly from
BUSY (code 14), HTTP 503 and a slow answer (``slow_seconds``, then a normal answer). Boot
failures use the same rate unless ``boot_rate`` says otherwise. The same seed gives the same sequence of decisions.
"""
from __future__ import annotations

import random
import threading
from enum import Enum


class Fault(str, Enum):
    NONE = "none"
    BUSY = "busy"
    UNAVAILABLE = "503"
    SLOW = "slow"


class FaultInjector:
    """Thread-safe, seeded decisions about which calls and boots misbehave."""

    KINDS = (Fault.BUSY, Fault.UNAVAILABLE, Fault.SLOW)

    def __init__(self, rate: float = 0.0, seed: int | None = None, slow_seconds: float = 1.0,
                 boot_rate: float | None = None) -> None:
        for value in (rate, boot_rate if boot_rate is not None else rate):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault rate must be within 0..1, not {value}")
        self.rate = rate
        self.slow_seconds = slow_seconds
        self.boot_rate = rate if boot_rate is None else boot_rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: dict[Fault, int] = {k: 0 for k in Fault}

    def for_call(self, method: str) -> Fault:
        if self.rate <= 0.0:
            return Fault.NONE
        with self._lock:
            hit = self._random.random() < self.rate
            kind = self._random.choice(self.KINDS) if hit else Fault.NONE
            self.counts[kind] += 1
        return kind

    def boot_fails(self) -> bool:
        if self.boot_rate <= 0.0:
            return False
        with self._lock:
            return self._random.random() < self.boot_rate
