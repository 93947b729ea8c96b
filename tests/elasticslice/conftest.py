"""Shared fixtures for the CloudLab side: a running emulator (CloudLab in a box) over real TLS.

``emulator``: a fresh emulator per test on 127.0.0.1 port 0, fast boots (0.2 s), with
``.dir``, ``.url`` (``https://127.0.0.1:P/protogeni/xmlrpc``), ``.config_path`` (a client
config that works as is) and ``.server`` (the :class:`EmulatorServer`).
``emulator_factory(**options)``: the same with other ``EmulatorServer`` options
(``fault_rate``, ``seed``, ``max_wait``, ``notify_interval``, ``inventory``...).
Generating RSA keys is slow, so the PKI is made once per session and copied.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elasticslice.emulator import EmulatorServer, init_emulator

FAST = {"boot_delay": 0.2, "notify_interval": 0.2, "max_wait": 5}


@dataclass
class RunningEmulator:
    dir: Path
    server: EmulatorServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def config_path(self) -> Path:
        return self.dir / "elasticslice.conf"

    @property
    def password(self) -> str:
        return (self.dir / "password").read_text().strip()


@pytest.fixture(scope="session")
def emulator_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One initialised emulator directory per session (CA, certificates, user.pem)."""
    return init_emulator(tmp_path_factory.mktemp("emulator-pki") / "emu", port=0)


@pytest.fixture
def emulator_factory(emulator_pki: Path, tmp_path: Path
                     ) -> Iterator[Callable[..., RunningEmulator]]:
    started: list[EmulatorServer] = []

    def make(**options: Any) -> RunningEmulator:
        directory = tmp_path / f"emu{len(started)}"
        shutil.copytree(emulator_pki, directory)
        settings = {**FAST, **options}
        server = EmulatorServer(directory, port=0, **settings)
        server.start()
        started.append(server)
        return RunningEmulator(directory, server)

    yield make
    for server in reversed(started):
        server.stop()


@pytest.fixture
def emulator(emulator_factory: Callable[..., RunningEmulator]) -> RunningEmulator:
    return emulator_factory()
