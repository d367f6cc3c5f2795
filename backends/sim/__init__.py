"""Paper-scale discrete-event simulator of one serving instance, driven by the shared cache brain.

Time comes from a roofline model of a hardware profile (:mod:`.cost`); every cache decision
(matching, eviction, prefetch, readiness) comes from :mod:`backends.kvcache`, the same code the
embedded engine runs.
"""

from __future__ import annotations

from .cost import CostModel, Work
from .events import EventQueue
from .profiles import HardwareProfile, ModelProfile, ProfileError, device_kv_tokens, load_hardware, load_model

__all__ = [
    "CostModel",
    "Work",
    "EventQueue",
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "device_kv_tokens",
    "load_hardware",
    "load_model",
]
