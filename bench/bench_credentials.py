"""What checking a credential costs the emulator, per call.

    .venv/bin/python bench/bench_credentials.py [--calls 300]

Times, in an initialised emulator directory: the full check of a fresh SA-signed slice
credential (XML-DSig, chain, authority, target), the same for a one-level delegation, and the
emulator's per-call check of a credential it has already verified (its cache). Prints a
table; exits 0.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
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
        rows = [("verify_credential, SA-signed slice credential",
                 _per_call_ms(lambda: credlib.verify_credential(xml, ca), args.calls)),
                ("emulator per-call check (cached)",
                 _per_call_ms(lambda: authority.verify(xml, user_urn), args.calls * 10))]
        delegate = getattr(credlib, "delegate", None)
        if delegate is not None:
            key = (d / "user.pem").read_bytes()
            password = (d / "password").read_text().strip()
            child = delegate(xml, user_cert, user_cert, key, key_password=password)
            rows.insert(1, ("verify_credential, one-level delegation",
                            _per_call_ms(lambda: credlib.verify_credential(child, ca),
                                         args.calls)))
    for name, ms in rows:
        print(f"{name:<48} {ms:8.3f} ms/call")


if __name__ == "__main__":
    main()
