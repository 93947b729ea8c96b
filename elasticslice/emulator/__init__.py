"""CloudLab in a box: SA, CM v2 and the dynamic-slice server over TLS, with its own CA.

    from elasticslice.emulator import init_emulator, EmulatorServer

    init_emulator("/tmp/emu")                      # CA, certificates, user.pem, client config
    with EmulatorServer("/tmp/emu", port=0, boot_delay=0.2) as emu:
        ...                                        # emu.url, emu.port, emu.config_path
"""
from __future__ import annotations

from elasticslice.emulator.app import EmulatorServer
from elasticslice.emulator.setup import EmulatorConfig, init_emulator, load_config

__all__ = ["EmulatorConfig", "EmulatorServer", "init_emulator", "load_config"]
