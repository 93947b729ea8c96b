"""The box's networks without booting anything (fast tier): when nodes get networks of their
own, how a node's LAN interfaces map to the fabric's bridges, and what `doctor` says of a
``listen`` against a box whose nodes are on networks of their own (the box's part of issue
23; the booting tests are test_network.py)."""
from __future__ import annotations

import logging

import pytest

from elasticslice.commands.doctor import check_addresses
from elasticslice.commands.run import RunSettings
from elasticslice.emulator import network


def test_nodes_get_networks_of_their_own_unless_told_off() -> None:
    assert network.choose({}) == network.choose({network.ENV_VAR: "auto"})  # the default
    assert network.choose({network.ENV_VAR: "off"}) == network.Choice(
        False, f"{network.ENV_VAR}=off")


def test_an_unknown_value_is_auto_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        choice = network.choose({network.ENV_VAR: "maybe"})
    assert f"{network.ENV_VAR}=maybe is not on, auto or off" in caplog.text
    assert choice == network.choose({network.ENV_VAR: "auto"})  # on here iff it works here


def test_a_nodes_lan_interfaces_go_on_their_lans_bridges() -> None:
    links = [{"client_id": "lan0", "vlantag": "3", "interfaces": ["a:if0", "b:if0"]},
             {"client_id": "lan1", "vlantag": "4", "interfaces": ["a:if1"]}]
    ifaces = [{"client_id": "a:if0", "ip": "10.10.4.1", "netmask": "255.255.255.0",
               "mac": "02:00:00:00:00:01"},
              {"client_id": "a:if1", "ip": "10.10.5.1", "netmask": "255.255.0.0", "mac": ""},
              {"client_id": "a:if9", "ip": None, "netmask": None}]   # on no LAN
    assert network.lans_of(ifaces, links) == [("lan3", "10.10.4.1", 24, "02:00:00:00:00:01"),
                                              ("lan4", "10.10.5.1", 16, "")]


def test_control_addresses_are_the_nodes_places_in_the_pool() -> None:
    fabric = network.Fabric()
    fabric.k = 2
    fabric.set_nodes([f"n{i}" for i in range(300)])
    assert fabric.control_ip == "100.66.0.1"
    assert [fabric.node_ip(n) for n in ("n0", "n1", "n253", "n254", "n299")] == \
        ["100.66.0.2", "100.66.0.3", "100.66.0.255", "100.66.1.0", "100.66.1.45"]


def _settings(listen: str, public_url: str | None = None) -> RunSettings:
    return RunSettings(listen=listen, public_url=public_url, image=None, hardware_type=None,
                       node_cores=None, margin=5.0, idle_timeout=60.0, agent_timeout=600.0,
                       metrics_port=None, scheduler_port=None, enrol_port=None,
                       publish_port=None, endpoint_port=0, max_nodes=4, node_python=None,
                       cm_urls=("https://127.0.0.1:1/cm",), manager=None,
                       sources={"listen": "--listen", "public_url": "--public-url"})


def test_doctor_fails_a_listen_the_boxs_nodes_cannot_reach() -> None:
    box = "100.64.0.1"
    loopback = check_addresses(_settings("127.0.0.1"), cm_local=True, box=box)
    assert not loopback.passed
    assert "listen 127.0.0.1 (--listen) is not where the box's nodes reach this machine" in \
        loopback.line() and f"reach it at {box} only" in loopback.line()
    assert f"[pilots] listen to {box}" in loopback.line()
    assert check_addresses(_settings(box), cm_local=True, box=box).passed
    public = check_addresses(_settings(box, "http://127.0.0.1:8000/t"), cm_local=True, box=box)
    assert not public.passed and "public_url http://127.0.0.1:8000/t" in public.line()
    # nodes on the host's network: loopback is fine against the box, as before
    assert check_addresses(_settings("127.0.0.1"), cm_local=True, box=None).passed
