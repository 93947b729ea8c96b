"""What checking a credential costs the emulator, per call.

    .venv/bin/python bench/bench_credentials.py [--calls 300] [--quick]

Times, in an initialised emulator directory: the full check of a fresh SA-signed slice
credential (XML-DSig, chain, authority, target), the same for a one-level delegation, and the
emulator's per-call check of a credential it has already verified (its cache). Prints a
table; exits 0. ``run(quick)`` is the harness's entry (``python -m bench --only credentials``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.emulator.authority import Authority  # noqa: E402
from elasticslice.emulator.setup import init_emulator, load_config  # noqa: E402
from elasticslice.rpc import credential as credlib  # noqa: E402

SLICE = "urn:publicid:IDN+emulab.test+slice+bench"


def _per_call_ms(fn: Callable[[], object], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1000


# figure name -> row label
FIGURES = {"verify_slice_credential_ms_per_call": "verify_credential, SA-signed slice credential",
           "verify_delegated_credential_ms_per_call": "verify_credential, one-level delegation",
           "emulator_cached_check_ms_per_call": "emulator per-call check (cached)"}


def measure(calls: int) -> dict[str, float]:
    """Milliseconds per call of each check (figure names of ``FIGURES``)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = init_emulator(Path(tmp) / "emu")
        cfg = load_config(d)
        authority = Authority(d, cfg.identity).load()
        user_pem = (d / "user.pem").read_text()
        user_cert = user_pem[:user_pem.index("-----END CERTIFICATE-----") + 25] + "\n"
        user_urn = cfg.identity.user_urn(cfg.user)
        expires = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
        xml = authority.credential(user_cert, user_urn, authority.slice_gid(SLICE), SLICE,
                                   expires)
        ca = [(d / "ca.pem").read_bytes()]
        figures = {"verify_slice_credential_ms_per_call":
                   _per_call_ms(lambda: credlib.verify_credential(xml, ca), calls)}
        key = (d / "user.pem").read_bytes()
        password = (d / "password").read_text().strip()
        child = credlib.delegate(xml, user_cert, user_cert, key, key_password=password)
        figures["verify_delegated_credential_ms_per_call"] = _per_call_ms(
            lambda: credlib.verify_credential(child, ca), calls)
        figures["emulator_cached_check_ms_per_call"] = _per_call_ms(
            lambda: authority.verify(xml, user_urn), calls * 10)
    return figures


def run(quick: bool = False) -> dict[str, Any]:
    figures: dict[str, Any] = {"calls": 50 if quick else 300}
    figures.update(measure(figures["calls"]))
    figures["table"] = [(FIGURES[k], f"{v:.3f} ms/call") for k, v in figures.items()
                        if k in FIGURES]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="50 calls")
    args = parser.parse_args()
    rows = [(FIGURES[k], v) for k, v in measure(50 if args.quick else args.calls).items()]
    for name, ms in rows:
        print(f"{name:<48} {ms:8.3f} ms/call")


if __name__ == "__main__":
    main()
