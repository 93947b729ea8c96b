"""CloudLab in a box: SA, CM v2 and the dynamic-slice server over TLS, with its own CA.

    from elasticslice.emulator import init_emulator, EmulatorServer

    init_emulator("/tmp/emu")                      # CA, certificates, user.pem, client config
    with EmulatorServer("/tmp/emu", port=0, boot_delay=0.2) as emu:
        ...                                        # emu.url, emu.port, emu.config_path
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elasticslice.emulator.app import EmulatorServer
    from elasticslice.emulator.setup import EmulatorConfig, init_emulator, load_config

__all__ = ["EmulatorConfig", "EmulatorServer", "init_emulator", "load_config"]
_WHERE = {"EmulatorServer": "app", "EmulatorConfig": "setup", "init_emulator": "setup",
          "load_config": "setup"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
