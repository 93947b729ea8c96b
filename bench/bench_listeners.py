"""The control node's listeners, quiet and under a stranger's flood (issue 34, point 5).

    .venv/bin/python bench/bench_listeners.py [--quick] [--samples N]

The four listeners of a control node run here: the callback endpoint (a
``SimpleElasticSliceClientEndpoint`` behind ``EndpointServer``, the emulator's CM
certificate the only caller), the enrolment service, the tarball publisher and the metrics
endpoint. For each, ``samples`` legitimate requests, one at a time and each on a new
connection as their real callers make them: the CM's NotifyDeletePending (with the CM's
certificate), a node's enrolment (a CSR with a fresh token), a GET of a tarball, a scrape.
First quiet, then while a stranger in another process (``python -m tests.hostile.flood``)
holds 1,000 idle and 100 trickling connections to EACH listener (4,400 in all) and opens
again every one a listener closes. Per listener and case: median and p99 of the answer
time (ms) and how many requests failed. Goal (issue 34): the CM's notice answered under
200 ms under the flood.
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.emulator import init_emulator  # noqa: E402
from elasticslice.managers.endpoint import SimpleElasticSliceClientEndpoint  # noqa: E402
from elasticslice.metrics import serve_metrics  # noqa: E402
from elasticslice.pilots import ClusterCA  # noqa: E402
from elasticslice.pilots.enrol import EnrolmentService  # noqa: E402
from elasticslice.pilots.publish import TarballPublisher  # noqa: E402
from elasticslice.rpc.endpoint import EndpointServer  # noqa: E402
from troy.frameworks.dask.enrol import new_key_and_csr  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CM_URN = "urn:publicid:IDN+emulab.test+authority+cm"
NOTICE = xmlrpc.client.dumps(({"nodelist": [{"node_id": "pc-nobody", "client_id": "nobody",
                                             "max_wait_time": 30}]},),
                             "NotifyDeletePending").encode()


class Listeners:
    """The four listeners and one legitimate request of each (True: answered as it should)."""

    def __init__(self, root: Path) -> None:
        self.emu = init_emulator(root / "emu", port=0)
        self.endpoint = EndpointServer(
            SimpleElasticSliceClientEndpoint(), certfile=self.emu / "user.pem",
            password=(self.emu / "password").read_text().strip(),
            ca_file=self.emu / "ca.pem", allowed_urns={CM_URN})
        self.ca = ClusterCA.open(root / "pki")
        self.enrolment = EnrolmentService(self.ca, is_held=lambda cid: True)
        self.publisher = TarballPublisher()
        self.cm = ssl.create_default_context(cafile=str(self.emu / "ca.pem"))
        self.cm.load_cert_chain(str(self.emu / "cm.pem"), str(self.emu / "cm-key.pem"))
        self.node = ssl.create_default_context(cafile=str(self.ca.ca_file))
        self.node.check_hostname = False
        self.tarball = root / "pilot.tar.gz"
        self.tarball.write_bytes(b"\x1f\x8b" + b"\0" * 20000)
        self.serial = 0

    def start(self) -> None:
        self.endpoint.start()
        self.enrolment.start()
        self.publisher.start()
        self.url = self.publisher.publish(self.tarball, "pilot.tar.gz")
        self.metrics = serve_metrics(lambda: None, units=lambda: {
            "queued": 1, "running": 1, "requeued": 0, "lost": 0})

    def stop(self) -> None:
        for stop in (self.metrics.stop, self.publisher.stop, self.enrolment.stop,
                     self.endpoint.stop):
            stop()

    def targets(self) -> list[str]:
        return [f"127.0.0.1:{self.endpoint.port}:tls",
                f"127.0.0.1:{self.enrolment.bound_port}:tls",
                f"127.0.0.1:{self.publisher.port_bound}",
                f"127.0.0.1:{self.metrics.bound_port}"]

    def notice(self) -> bool:
        conn = http.client.HTTPSConnection("127.0.0.1", self.endpoint.port, context=self.cm,
                                           timeout=30)
        try:
            conn.request("POST", "/", body=NOTICE, headers={"Content-Type": "text/xml"})
            answer = conn.getresponse()
            ((result,), _) = xmlrpc.client.loads(answer.read())
            return answer.status == 200 and result["code"] == 0
        finally:
            conn.close()

    def enrol(self) -> bool:
        self.serial += 1
        client_id = f"node-{self.serial}"
        token = self.enrolment.token_for(client_id, deadline=time.time() + 600)
        _, csr = new_key_and_csr(client_id)
        conn = http.client.HTTPSConnection("127.0.0.1", self.enrolment.bound_port,
                                           context=self.node, timeout=30)
        try:
            body = json.dumps({"token": token, "client_id": client_id, "csr": csr.decode()})
            conn.request("POST", "/enrol", body=body,
                         headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            return answer.status == 200 and "certificate" in json.loads(answer.read())
        finally:
            conn.close()

    def fetch(self) -> bool:
        with urllib.request.urlopen(self.url, timeout=30) as answer:
            return len(answer.read()) == 20002

    def scrape(self) -> bool:
        with urllib.request.urlopen(self.metrics.url, timeout=30) as answer:
            return b"elasticslice_units_queued" in answer.read()


def sample(request: Callable[[], bool], n: int) -> dict[str, float]:
    times, failed = [], 0
    for _ in range(n):
        started = time.perf_counter()
        try:
            ok = request()
        except (OSError, ssl.SSLError, http.client.HTTPException, xmlrpc.client.Error) as err:
            logging.getLogger("bench").warning("%s failed: %r", request.__name__, err)
            ok = False
        if ok:
            times.append((time.perf_counter() - started) * 1000)
        else:
            failed += 1
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))] if times else float("nan")
    return {"median_ms": statistics.median(times) if times else float("nan"),
            "p99_ms": p99, "failed": failed}


def measure(samples: int) -> dict[str, dict[str, dict[str, float]]]:
    root = Path(tempfile.mkdtemp(prefix="bench-listeners-"))
    listeners = Listeners(root)
    listeners.start()
    requests = {"notice": listeners.notice, "enrol": listeners.enrol,
                "tarball": listeners.fetch, "metrics": listeners.scrape}
    results: dict[str, dict[str, dict[str, float]]] = {"quiet": {}, "flooded": {}}
    flood = None
    try:
        for name, request in requests.items():
            results["quiet"][name] = sample(request, samples)
        flood = subprocess.Popen([sys.executable, "-m", "tests.hostile.flood",
                                  *listeners.targets()], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        if flood.stdout.readline().strip() != "established":
            raise SystemExit("the flood did not establish its connections")
        time.sleep(2)   # the first evicted connections come back: the churn is on
        for name, request in requests.items():
            results["flooded"][name] = sample(request, samples)
    finally:
        if flood is not None and flood.stdin is not None:
            flood.stdin.close()
            flood.wait(timeout=60)
        listeners.stop()
        shutil.rmtree(root, ignore_errors=True)
    return results


def run(quick: bool = False) -> dict[str, Any]:
    results = measure(30 if quick else 200)
    figures: dict[str, Any] = {}
    table = []
    for name in ("notice", "enrol", "tarball", "metrics"):
        quiet, flooded = results["quiet"][name], results["flooded"][name]
        for case, figures_of in (("quiet", quiet), ("flooded", flooded)):
            for key, value in figures_of.items():
                figures[f"listeners_{name}_{case}_{key}"] = value
        table.append((f"{name}: quiet / under 1,000 idle + 100 trickling per listener "
                      f"(median, p99; failed)",
                      f"{quiet['median_ms']:.1f}, {quiet['p99_ms']:.1f} ms; {quiet['failed']:.0f}"
                      f" / {flooded['median_ms']:.1f}, {flooded['p99_ms']:.1f} ms; "
                      f"{flooded['failed']:.0f}"))
    figures["table"] = table
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="30 samples")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = measure(30 if args.quick else args.samples)
    print(f"{'listener':10} {'case':8} {'median ms':>10} {'p99 ms':>10} {'failed':>7}")
    for case in ("quiet", "flooded"):
        for name, got in results[case].items():
            print(f"{name:10} {case:8} {got['median_ms']:10.1f} {got['p99_ms']:10.1f} "
                  f"{got['failed']:7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
