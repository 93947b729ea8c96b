"""An emulator per test (fresh directory, port 0) and a client configured for it."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticslice.config import ClientConfig, load_config
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.transport import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


@dataclass
class Emu:
    dir: Path
    server: object
    config_path: Path
    cache_dir: Path

    @property
    def url(self) -> str:
        return self.server.url  # type: ignore[attr-defined]

    def config(self, **env: str) -> ClientConfig:
        base = {"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(self.cache_dir)}
        return load_config(self.config_path, env={**base, **env})

    def client(self, retry: RetryPolicy = FAST_RETRY, **env: str) -> ProtoGeniServer:
        return ProtoGeniServer(self.config(**env), retry=retry)


def start_emulator(directory: Path, **options: object) -> object:
    from elasticslice.emulator import EmulatorServer, init_emulator
    if not (directory / "ca.pem").exists():
        init_emulator(directory)
    return EmulatorServer(directory, port=0, **options).start()


@pytest.fixture(scope="session")
def emu_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One initialised emulator directory (keys are the slow part), copied per test."""
    from elasticslice.emulator import init_emulator
    return init_emulator(tmp_path_factory.mktemp("emu-template") / "emu")


@pytest.fixture
def emu_options() -> dict[str, object]:
    """Override in a test module to start the emulator differently."""
    return {"boot_delay": 0.05}


@pytest.fixture
def emu(tmp_path: Path, emu_options: dict[str, object], emu_template: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Emu]:
    cache = tmp_path / "credcache"
    # The CLI reads the real environment: keep its cache inside the test too.
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(cache))
    monkeypatch.delenv("PROTOGENI_PASSPHRASE", raising=False)
    shutil.copytree(emu_template, tmp_path / "emu", symlinks=True)
    server = start_emulator(tmp_path / "emu", **emu_options)
    try:
        yield Emu(tmp_path / "emu", server, tmp_path / "emu" / "elasticslice.conf", cache)
    finally:
        server.stop()  # type: ignore[attr-defined]
