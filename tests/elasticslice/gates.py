"""Work for a node's Dask worker that ends when the test says: :func:`gated`.

A node has no tests package: this module is registered with cloudpickle to travel by
value (Dask's pickling sends a function of a module so registered with its code), so
that the tests that need it share one copy instead of each defining its own inside the
test.
"""
from __future__ import annotations

import sys
from typing import Any

import cloudpickle


def gated(value: Any, url: str, ran: str | None = None) -> Any:
    """``value`` once the test's gate at ``url`` is open (a ``Witness`` gate: the test says
    when the work may end, whatever the machine's load); the node it ran on told to
    ``ran`` (the witness's ``/ran/<task>``: ``/ran/<task>/<node>``) when given."""
    import socket
    import time
    import urllib.error
    import urllib.request
    while True:  # the witness holds a closed gate's answer up to 4 s, then 404
        try:
            urllib.request.urlopen(url, timeout=30).close()
            break
        except urllib.error.HTTPError:
            time.sleep(0.05)
    if ran is not None:
        node = socket.gethostname().split(".")[0]
        urllib.request.urlopen(f"{ran}/{node}", timeout=30).close()
    return value


cloudpickle.register_pickle_by_value(sys.modules[__name__])
