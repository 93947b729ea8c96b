"""Emulator memory under parallel large XML-RPC bodies (issue 7, "Bounded resources").

    .venv/bin/python bench/bench_emulator_bounds.py [--parallel 20] [--size-mb MB]
        [--method CreateSliver] [--payload plain|rspec] [--credential none|slice] [--json]

Starts ``elasticslice emulator serve`` in a subprocess, sends ``--parallel`` authenticated
bodies of ``--size-mb`` MB at once (each on its own TLS connection, the user's
certificate), and while they are in flight asks GetVersion on a fresh connection. The
emulator's resident memory is read from ``/proc/PID/status`` (peak = ``VmHWM``). Prints the
peak RSS, how the large calls were answered (HTTP status: 200 answered, 413 too large, 503
overloaded) and how long GetVersion took during and after the load; with ``--json`` one
JSON object per scenario. Without ``--size-mb`` it runs two scenarios: RSpec bodies just
under the CreateSliver limit with a real slice credential (so the CM parses them), and
60 MB bodies. Exits 0 (1 when the emulator stopped answering). ``run(quick)`` is the
harness's entry (``python -m bench --only emulator_bounds``; quick: the first scenario with 2
parallel bodies).
"""
from __future__ import annotations

import argparse
import collections
import http.client
import json
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import xml.sax.saxutils
import xmlrpc.client
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.emulator import init_emulator  # noqa: E402
from elasticslice.emulator.bounds import Limits  # noqa: E402

PATH = "/protogeni/xmlrpc/cm"
NODE = ('<node client_id="n{0}" exclusive="true"><sliver_type name="raw-pc"/>'
        '<hardware_type name="m510"/><interface client_id="n{0}:if0"/></node>\n')


def make_body(method: str, size: int, payload: str, credential: str = "not a credential",
              slice_urn: str = "urn:publicid:IDN+emulab.test+slice+bench") -> bytes:
    """One XML-RPC call of at most ``size`` bytes: a huge ``rspec`` string argument.

    ``plain`` is one long run of letters (cheap to parse); ``rspec`` is an RSpec of as many
    nodes as fit, which XML-RPC escapes into many entities (the worst case for parsers)."""
    params = {"slice_urn": slice_urn, "rspec": "", "credentials": [credential]}
    room = size - len(xmlrpc.client.dumps((params,), method).encode())
    if payload == "rspec":
        head = '<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">'
        per_node = len(xml.sax.saxutils.escape(NODE.format(10 ** 6)))
        count = max(1, (room - 2 * len(head)) // per_node)
        text = head + "".join(NODE.format(i) for i in range(count)) + "</rspec>"
    else:
        text = "x" * room
    params["rspec"] = text
    return xmlrpc.client.dumps((params,), method).encode()


def user_tls(d: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    ctx.load_cert_chain(str(d / "user.pem"), password=(d / "password").read_text().strip())
    return ctx


def post(port: int, ctx: ssl.SSLContext, body: bytes, timeout: float = 300.0) -> int | str:
    """HTTP status of one POST, or the name of the error that ended it."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("POST", PATH, body, {"Content-Type": "text/xml"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException) as err:
        return type(err).__name__
    finally:
        conn.close()


def get_version(port: int, ctx: ssl.SSLContext, timeout: float = 120.0) -> float | None:
    """Seconds a GetVersion call took, None when it failed."""
    started = time.monotonic()
    body = xmlrpc.client.dumps(({},), "GetVersion").encode()
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("POST", PATH, body, {"Content-Type": "text/xml"})
        resp = conn.getresponse()
        (value,), _ = xmlrpc.client.loads(resp.read())
        if resp.status != 200 or value.get("code") != 0:
            return None
    except (OSError, http.client.HTTPException, xmlrpc.client.Error):
        return None
    finally:
        conn.close()
    return time.monotonic() - started


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_emulator(d: Path) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticslice.cli", "emulator", "serve", "--dir", str(d),
         "--port", "0", "--boot-delay", "0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (d / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the emulator did not start")
        time.sleep(0.05)
    return proc, int(json.loads((d / "server.json").read_text())["port"])


def slice_credential(port: int, ctx: ssl.SSLContext) -> tuple[str, str]:
    """Register a slice at the SA: its URN and credential (so the CM parses the RSpec)."""
    sa = xmlrpc.client.ServerProxy(f"https://127.0.0.1:{port}/protogeni/xmlrpc/sa",
                                   context=ctx)
    user = sa.GetCredential({})["value"]
    cred = sa.Register({"credential": user, "type": "Slice", "hrn": "bench"})["value"]
    return "urn:publicid:IDN+emulab.test+slice+bench", cred


def scenario(d: Path, parallel: int, size: int, method: str, payload: str,
             credential: str) -> dict[str, Any]:
    proc, port = start_emulator(d)
    ctx = user_tls(d)
    try:
        baseline = rss_kib(proc.pid)
        if credential == "slice":
            slice_urn, cred = slice_credential(port, ctx)
            body = make_body(method, size, payload, cred, slice_urn)
        else:
            body = make_body(method, size, payload)
        statuses: list[int | str] = []
        threads = [threading.Thread(target=lambda: statuses.append(post(port, ctx, body)))
                   for _ in range(parallel)]
        peak_seen = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak_seen[0] = max(peak_seen[0], rss_kib(proc.pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(0.5)  # the large calls are in flight
        during = get_version(port, ctx)
        for t in threads:
            t.join(timeout=600)
        elapsed = time.monotonic() - started
        done.set()
        after = get_version(port, ctx)
        return {"parallel": parallel, "body_bytes": len(body), "method": method,
                "payload": payload, "credential": credential,
                "baseline_rss_mb": round(baseline / 1024, 1),
                "peak_rss_mb": round(max(rss_kib(proc.pid, "VmHWM"), peak_seen[0]) / 1024, 1),
                "rss_after_mb": round(rss_kib(proc.pid) / 1024, 1),
                "statuses": dict(collections.Counter(str(s) for s in statuses)),
                "getversion_during_s": None if during is None else round(during, 2),
                "getversion_after_s": None if after is None else round(after, 2),
                "elapsed_s": round(elapsed, 1), "alive": proc.poll() is None}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        (d / "state.db").unlink(missing_ok=True)


def report(result: dict[str, Any]) -> str:
    return (f"{result['parallel']} parallel {result['method']} bodies of "
            f"{result['body_bytes'] / 1e6:.1f} MB ({result['payload']}, credential "
            f"{result['credential']}): emulator RSS {result['baseline_rss_mb']} MB idle, peak "
            f"{result['peak_rss_mb']} MB, {result['rss_after_mb']} MB after\n"
            f"  answers: {result['statuses']}; GetVersion during the load: "
            f"{result['getversion_during_s']} s, after: {result['getversion_after_s']} s; "
            f"{result['elapsed_s']} s in all")


def run(quick: bool = False) -> dict[str, Any]:
    """Both default scenarios (quick: the RSpec one, 2 bodies), as flat figures."""
    parallel = 2 if quick else 20
    named = [("rspec_at_limit_slice_cred", Limits().large_body, "rspec", "slice"),
             ("plain_60mb_no_cred", 60 * 1024 * 1024, "plain", "none")][:1 if quick else 2]
    figures: dict[str, Any] = {"parallel_bodies": parallel}
    table = []
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as tmp:
        d = Path(tmp) / "emu"
        init_emulator(d, port=0)
        for name, size, payload, credential in named:
            r = scenario(d, parallel, size, "CreateSliver", payload, credential)
            for key in ("body_bytes", "baseline_rss_mb", "peak_rss_mb", "rss_after_mb",
                        "getversion_during_s", "getversion_after_s", "elapsed_s", "alive"):
                figures[f"{name}_{key}"] = r[key]
            for status, count in r["statuses"].items():
                figures[f"{name}_http_{status}_answers"] = count
            table.append((f"{name}: emulator peak RSS / after", f"{r['peak_rss_mb']} MB / "
                          f"{r['rss_after_mb']} MB (idle {r['baseline_rss_mb']} MB)"))
            table.append((f"{name}: answers; GetVersion during / after",
                          f"{r['statuses']}; {r['getversion_during_s']} s / "
                          f"{r['getversion_after_s']} s"))
    figures["table"] = table
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--size-mb", type=float, help="body size in MiB (default: scenarios)")
    parser.add_argument("--method", default="CreateSliver")
    parser.add_argument("--payload", choices=("plain", "rspec"), default="rspec")
    parser.add_argument("--credential", choices=("none", "slice"), default="slice")
    parser.add_argument("--dir", type=Path, help="an initialised emulator directory to copy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.size_mb is not None:
        scenarios = [(int(args.size_mb * 1024 * 1024), args.method, args.payload,
                      args.credential)]
    else:
        scenarios = [(Limits().large_body, "CreateSliver", "rspec", "slice"),
                     (60 * 1024 * 1024, "CreateSliver", "plain", "none")]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as tmp:
        d = Path(tmp) / "emu"
        if args.dir:
            shutil.copytree(args.dir, d, ignore=shutil.ignore_patterns(
                "state.db*", "serve.lock", "server.json", "nodes"))
        else:
            init_emulator(d, port=0)
        for size, method, payload, credential in scenarios:
            result = scenario(d, args.parallel, size, method, payload, credential)
            results.append(result)
            print(json.dumps(result) if args.json else report(result), flush=True)
    ok = all(r["alive"] and r["getversion_after_s"] is not None for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
