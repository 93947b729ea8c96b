"""Several CMs, fast (issue 37, pilots across sites): where the control side listens by
default when the nodes of every CM must reach it, the site a CM's nodes are labelled with,
and a pilot's site in Troy's description and in the drain's choice of pilot."""
from __future__ import annotations

import pytest

import troy
from elasticslice.config import cm_site, default_listen, route_to, site_names
from elasticslice.pilots.watch import PilotWatch, site_of
from troy.errors import BadParameter

UTAH = "https://www.utah.cloudlab.us:12369/protogeni/xmlrpc/cm"
WISC = "https://www.wisc.cloudlab.us:12369/protogeni/xmlrpc/cm"
BOX = "https://127.0.0.1:{}/cluster/{}/protogeni/xmlrpc/cm"
TEST_NET = "https://192.0.2.77:12369/protogeni/xmlrpc/cm"   # not this machine (RFC 5737)


def test_a_cm_s_site_is_its_cluster_s_name() -> None:
    assert cm_site(UTAH) == "utah" and cm_site(WISC) == "wisc"
    assert cm_site("https://www.clemson.cloudlab.us:12369/protogeni/xmlrpc/cm") == "clemson"
    assert cm_site("https://boss.emulab.net/protogeni/xmlrpc/cm") == "emulab"
    assert cm_site(BOX.format(5, "wisc")) == "wisc"
    assert cm_site("https://127.0.0.1:5/protogeni/xmlrpc/cm") == "127.0.0.1"


def test_site_names_are_unique_even_for_two_boxes_with_a_cluster_of_one_name() -> None:
    assert site_names([UTAH, WISC]) == {UTAH: "utah", WISC: "wisc"}
    a, b = BOX.format(5, "utah"), BOX.format(6, "utah")
    assert site_names([a, b]) == {a: "utah@127.0.0.1:5", b: "utah@127.0.0.1:6"}


def test_default_listen_is_loopback_only_when_every_cm_is_on_this_machine() -> None:
    assert default_listen([BOX.format(5, "utah"), BOX.format(5, "wisc")]) == "127.0.0.1"
    assert default_listen([]) == "127.0.0.1"
    route = route_to(TEST_NET)
    if route is None:
        pytest.skip("no route from this machine to 192.0.2.77")
    # the first CM on this machine used to decide for all: loopback, which no node of
    # the other CM reaches
    assert default_listen([BOX.format(5, "utah"), TEST_NET]) == route != "127.0.0.1"


def test_a_pilot_s_site_is_a_checked_field_of_its_description() -> None:
    assert troy.PilotDescription(size=2, site="utah").site == "utah"
    assert troy.PilotDescription(size=2).site is None
    with pytest.raises(BadParameter, match="site"):
        troy.PilotDescription(size=2, site=3)


def test_the_drain_never_takes_a_pilot_at_another_site_for_the_revoked_node_s() -> None:
    session = troy.Session()
    try:
        fw = session.add_framework("local", "here")
        pilot = fw.submit_pilot(troy.PilotDescription(size=1))
        watch = PilotWatch(fw, clock=lambda: 0.0)
        watch.sites = {UTAH: "utah", WISC: "wisc"}
        watch.cm_of = lambda name: WISC if name == "w1" else None
        pilot.worker_name = "w1"
        watch.label(pilot)
        assert site_of(pilot) == "wisc"
        assert watch.pilot_of("w1", WISC) is pilot
        assert watch.pilot_of("w1") is pilot                # no CM said: by name alone
        assert watch.pilot_of("w1", UTAH) is None           # utah's w1 is not this pilot
    finally:
        session.close()
