"""Overlays (seed 000): pilots described, scheduled onto frameworks, and provisioned."""
from __future__ import annotations

from troy.descriptions import PilotDescription
from troy.overlay.manager import OverlayManager
from troy.overlay.following import FollowingOverlay
from troy.overlay.overlay import Overlay, Pilot

__all__ = ["PilotDescription", "Pilot", "Overlay", "OverlayManager", "FollowingOverlay"]
