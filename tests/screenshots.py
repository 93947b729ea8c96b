"""Headless Chromium screenshots of what users watch (the Dask dashboard, a ``troy plot``).

The tests that use it take the pictures into their own folder and check them; with
``ELASTICSLICE_SCREENSHOTS=DIR`` set they also copy them there (``docs/`` keeps the ones the
README shows: ``make test PYTEST_ARGS=... ELASTICSLICE_SCREENSHOTS=$PWD/docs``). Chromium is
Debian's ``chromium`` (``make browser``, which ``make test`` runs, installs it where it is
root on Debian); without it the pictures are not taken.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# what the machine's closed network and a root user need (each start otherwise tries
# Google's hosts, and a root Chromium refuses to start sandboxed)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]


def need_chromium() -> str:
    """Chromium's path; the test skips without it."""
    if not CHROMIUM:
        pytest.skip("no chromium (Debian's package chromium; make browser installs it)")
    return CHROMIUM


class Page:
    """``url`` in a headless Chromium, driven over the DevTools protocol (tornado, which Dask
    brings, speaks its websocket): real time passes while the page's scripts run (a Bokeh
    page fetches its document over a websocket, which ``--screenshot`` does not wait for).
    """

    def __init__(self, url: str, size: tuple[int, int] = (1400, 900)) -> None:
        self.url, self.size = url, size
        # (Chromium's helper processes may still write there as it ends)
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-",
                                                    ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [need_chromium(), *FLAGS, f"--user-data-dir={self._profile.name}",
             f"--window-size={size[0]},{size[1]}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self._ids = 0
        from tornado.ioloop import IOLoop
        self.loop = IOLoop()
        self.ws = self.loop.run_sync(self._connect, timeout=60)

    async def _connect(self):  # noqa: ANN202 - a tornado websocket
        import json as _json
        from tornado.httpclient import AsyncHTTPClient
        from tornado.websocket import websocket_connect
        port = None
        for line in self.proc.stderr:            # "DevTools listening on ws://..."
            if "DevTools listening on" in line:
                port = line.split("ws://127.0.0.1:", 1)[1].split("/", 1)[0]
                break
        if port is None:
            raise AssertionError("chromium did not start its DevTools endpoint")
        client = AsyncHTTPClient()
        targets = _json.loads((await client.fetch(f"http://127.0.0.1:{port}/json")).body)
        page = next(t for t in targets if t.get("type") == "page")
        return await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=1 << 28)

    def call(self, method: str, **params: object) -> dict:
        import json as _json
        self._ids += 1
        ident = self._ids

        async def send() -> dict:
            await self.ws.write_message(_json.dumps({"id": ident, "method": method,
                                                     "params": params}))
            while True:
                message = await self.ws.read_message()
                if message is None:
                    raise AssertionError("chromium closed its DevTools connection")
                reply = _json.loads(message)
                if reply.get("id") == ident:
                    if "error" in reply:
                        raise AssertionError(f"chromium: {method}: {reply['error']}")
                    return reply.get("result", {})
        return self.loop.run_sync(send, timeout=60)

    def evaluate(self, expression: str) -> object:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def screenshot(self, out: Path) -> Path:
        """The page as shown now, as PNG at ``out``; copied to ``$ELASTICSLICE_SCREENSHOTS``
        when set."""
        import base64
        data = self.call("Page.captureScreenshot", format="png")["data"]
        out.write_bytes(base64.b64decode(data))
        keep = os.environ.get("ELASTICSLICE_SCREENSHOTS")
        if keep:
            shutil.copy(out, Path(keep) / out.name)
        return out

    def close(self) -> None:
        """Chromium and its helper processes (its own session) stopped, its profile gone."""
        import signal
        self.ws.close()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.loop.close()
        self._profile.cleanup()

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def has_colour(path: Path, rgb: str, tolerance: int = 24) -> bool:
    """Whether the picture has a pixel within ``tolerance`` (per channel) of ``rgb``
    (``"#9467bd"``): a plot's marker, a chart's bar (Pillow, which matplotlib brings, reads
    it)."""
    from PIL import Image
    want = tuple(int(rgb[i:i + 2], 16) for i in (1, 3, 5))
    with Image.open(path) as image:
        assert image.format == "PNG", f"{path} is not a PNG"
        found = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    return any(all(abs(a - b) <= tolerance for a, b in zip(colour, want))
               for _, colour in found)


def browser() -> bool:
    """Whether the tests take screenshots here."""
    return CHROMIUM is not None
