"""A box of two clusters whose first fills up, for the tests of Parsl's blocks and Dask's
adapt across sites (issue 37, item 3): :func:`small_first_site` serves utah with
:data:`UTAH_NODES` nodes and wisc with more, every node of 2 cores (a Dask worker's
threads), and :func:`held_per_cm` is what each CM says the slice holds there."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elasticslice.emulator.clusters import inventory_text
from elasticslice.managers.sites import cm_name
from tests.elasticslice.emulator.helpers import RunningEmulator, cluster_box
from tests.elasticslice.managers.helpers import PATIENT_RETRY, client_for

UTAH_NODES = 2   # the sliver's first node and one more: then utah is full
WISC_NODES = 6


@contextlib.contextmanager
def small_first_site(directory: Path, **settings: Any) -> Iterator[RunningEmulator]:
    """A box of utah (:data:`UTAH_NODES` m510s) and wisc (:data:`WISC_NODES` c220g5s), no
    hardware type in common (so a slice across them asks for none), each node 2 cores."""
    directory.mkdir(parents=True, exist_ok=True)
    utah, wisc = directory / "utah.ini", directory / "wisc.ini"
    utah.write_text(inventory_text("m510", [("m510", UTAH_NODES, 2, 65536, "ms10")]))
    wisc.write_text(inventory_text("c220g5", [("c220g5", WISC_NODES, 2, 65536, "c220g5n")]))
    with cluster_box(directory / "emu", clusters=(f"utah={utah}", f"wisc={wisc}"),
                     **settings) as box:
        yield box


def held_per_cm(box: RunningEmulator, cache: Path) -> dict[str, list[str]]:
    """Each CM's name -> the client_ids its SliverStatus lists for the slice, sorted (none:
    no sliver there), read with a client of its own."""
    from elasticslice.errors import ElasticSliceError
    out: dict[str, list[str]] = {}
    with client_for(box, cache, PATIENT_RETRY) as look:
        for cm in look.cms:
            try:
                out[cm_name(cm.url)] = sorted(n.client_id for n in cm.sliver_status().nodes)
            except ElasticSliceError:
                out[cm_name(cm.url)] = []
    return out
