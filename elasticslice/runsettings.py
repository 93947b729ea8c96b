"""The settings of a run of pilots (``elasticslice run``, ``doctor``, the demo, the manager
daemon they start): each of :data:`SETTINGS` from the command line, else the config file's
key, else its default, with where each came from (:func:`resolve_settings`)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from elasticslice.errors import ElasticSliceError


class SettingsError(ElasticSliceError):
    """A bad setting: one line naming the option, or the key and the file (exit 2)."""


#: option (its Python name) -> (config section, key, default, help). One source of truth:
#: the command line, else the config file's key, else the default. ``doctor`` takes the same.
SETTINGS: dict[str, tuple[str, str, Any, str]] = {
    "listen": ("pilots", "listen", None,
               "The address the Dask scheduler, the callback endpoint, the tarball publisher "
               "and enrolment listen on, which the nodes reach (the box's config names its "
               "control address: its nodes are on a network of their own). Config [pilots] "
               "listen. Default: loopback when the CM runs on this machine, else the "
               "address of the interface that routes to the CM's host."),
    "public_url": ("pilots", "public_url", None,
                   "The base URL (http or https, no query) CloudLab fetches the nodes' "
                   "tarballs from, e.g. http://ctl.example.org:8080 when a proxy or NAT "
                   "fronts the publisher. Config [pilots] public_url. Default: the "
                   "publisher's own address on --listen."),
    "image": ("pilots", "disk_image", None,
              "The disk image the nodes boot (a URN, urn:publicid:IDN+...+image+PROJECT//"
              "NAME). Config [pilots] disk_image. Default: the CM's default image."),
    "hardware_type": ("pilots", "hardware_type", None,
                      "Ask the CM for this node type (m510, xl170, d430, ...). Config "
                      "[pilots] hardware_type. Default: any."),
    "node_cores": ("pilots", "node_cores", None,
                   "Cores each pilot offers to tasks. Config [pilots] node_cores. Default: "
                   "the node's cores."),
    "margin": ("pilots", "margin", 5.0,
               "Seconds kept before a revocation's deadline: a pilot's units that cannot "
               "end by then are requeued. Config [pilots] margin. Default: 5."),
    "idle_timeout": ("pilots", "idle_timeout", 60.0,
                     "Seconds a pilot stays idle before its node is given back ('never': "
                     "kept). Config [pilots] idle_timeout. Default: 60."),
    "agent_timeout": ("pilots", "agent_timeout", 120.0,
                      "Seconds a ready node's agent has to join before the node is replaced "
                      "(a stock image builds the agent's environment first). Config [pilots] "
                      "agent_timeout. Default: 120."),
    "metrics_port": ("pilots", "metrics_port", None,
                     "Serve the manager's Prometheus metrics on 127.0.0.1:PORT/metrics (0: any "
                     "free port; the run names the URL). Config [pilots] metrics_port. "
                     "Default: none (off)."),
    "scheduler_port": ("pilots", "scheduler_port", None,
                       "A fixed port for the Dask scheduler, which the nodes' agents join "
                       "(TLS). Config [pilots] scheduler_port. Default: the port this "
                       "--state-dir used last, else any free one."),
    "enrol_port": ("pilots", "enrol_port", None,
                   "A fixed port for the enrolment service (HTTPS), where nodes get and "
                   "renew their certificates. Config [pilots] enrol_port. Default: the port "
                   "this --state-dir used last, else any free one."),
    "publish_port": ("pilots", "publish_port", None,
                     "A fixed port for the tarball publisher (HTTP), where CloudLab's ops "
                     "server fetches the slice's tarball at every sliver change and nodes "
                     "fetch their software. Config [pilots] publish_port. Default: the port "
                     "this --state-dir used last (its URL must not change while nodes are "
                     "held), else any free one."),
    "endpoint_port": ("endpoint", "port", 0,
                      "The callback endpoint's port (0: any free port; open it to the CM). "
                      "Config [endpoint] port. Default: 0."),
}
#: what ``--max-nodes`` falls back to without ``[manager] maxthreshold``
DEFAULT_MAX_NODES = 4
#: ``[manager]`` keys a run takes when the config gives them (the others describe the
#: experiment ``manage`` runs: a run's experiment is its pilots, ``[pilots]``)
MANAGER_KEYS_RUN_TAKES = ("minthreshold", "maxthreshold", "percent_available_minimum",
                          "enable_delete", "retry_interval", "cmlist", "renew_hours",
                          "renew_margin", "add_cooldown", "delete_cooldown",
                          "max_add_per_cycle", "max_delete_per_cycle", "hysteresis", "email")
POLICY_KEYS = ("add_cooldown", "delete_cooldown", "max_add_per_cycle", "max_delete_per_cycle",
               "hysteresis")


def option_name(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What a run uses, resolved: each of :data:`SETTINGS` by its option's name, where each
    came from (``sources``: "--listen", "/path/c.conf [pilots] listen" or "default"), and
    the config's ``[manager]``/``[endpoint]`` (``manager``)."""

    listen: str
    public_url: str | None
    image: str | None
    hardware_type: str | None
    node_cores: int | None
    margin: float
    idle_timeout: float
    agent_timeout: float
    metrics_port: int | None
    scheduler_port: int | None
    enrol_port: int | None
    publish_port: int | None
    endpoint_port: int
    max_nodes: int
    node_python: str | None
    cm_urls: tuple[str, ...]
    manager: Any
    sources: dict[str, str]
    cmlist: tuple[str, ...] = ()   # the CMs of --cm (URLs), () when not given


    def cluster_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``ElasticCluster`` (besides server and state dir)."""
        from elasticslice.managers.policy import PolicyConfig
        m = self.manager
        given = m.given if m is not None else frozenset()
        options: dict[str, Any] = {"agent_timeout": self.agent_timeout}
        for key in ("percent_available_minimum", "enable_delete", "retry_interval",
                    "renew_hours", "renew_margin"):
            if key in given:
                options[key] = getattr(m, key)
        if self.cmlist:
            options["cmlist"] = list(self.cmlist)
        elif "cmlist" in given:
            options["cmlist"] = list(m.cms(self.cm_urls))
        if "email" in given and m.email.enabled:
            from elasticslice.managers.notify import Notifier
            options["email"] = Notifier(m.email)
        endpoint_keys = {k for k in given if k.startswith("endpoint.")} - {"endpoint.port"}
        if endpoint_keys:  # more than where it listens: the [endpoint] the config gives
            ep = m.endpoint
            options["endpoint"] = dataclasses.replace(
                ep, address=ep.address if "endpoint.address" in given else self.listen,
                port=self.endpoint_port) if ep.enabled else None
        args: dict[str, Any] = dict(
            maxthreshold=self.max_nodes, hardware_type=self.hardware_type,
            listen=self.listen, margin=self.margin,
            idle_timeout=None if math.isinf(self.idle_timeout) else self.idle_timeout,
            endpoint_port=self.endpoint_port, metrics_port=self.metrics_port,
            scheduler_port=self.scheduler_port, enrol_port=self.enrol_port,
            publish_port=self.publish_port,
            disk_image=self.image,
            node_python=self.node_python, node_cores=self.node_cores,
            manager_options=options)
        if "minthreshold" in given:
            args["minthreshold"] = min(m.minthreshold, self.max_nodes)
        intervals = {k[len("interval."):]: m.intervals[k[len("interval."):]]
                     for k in given if k.startswith("interval.")}
        if intervals:
            args["intervals"] = intervals
        policy = {k: getattr(m, k) for k in POLICY_KEYS if k in given}
        if policy:   # over the cluster's own quick defaults
            args["policy"] = PolicyConfig(**{
                "add_cooldown": 1.0, "delete_cooldown": 5.0,
                "max_add_per_cycle": max(1, self.max_nodes), "max_delete_per_cycle": 1,
                **policy})
        if self.public_url:   # only when set: an ElasticCluster without it still works
            args["public_url"] = self.public_url
        return args


def resolve_settings(client: Any, given: dict[str, Any],
                     max_nodes: int | None = None) -> RunSettings:
    """The run's settings: ``given`` (the options, None when not given) over the config
    file of ``client`` (a ``ClientConfig``: ``[pilots]``, ``[manager]``, ``[endpoint]``)
    over the defaults. A bad value is :class:`SettingsError` naming the option, or the key
    and the file."""
    from elasticslice.config import (PILOTS_SECTION, PilotSettings, default_listen,
                                     load_pilot_settings, pilot_value, port_number)
    from elasticslice.errors import ConfigError
    from elasticslice.managers.config import load_manager_config
    path = client.path
    try:
        pilots = load_pilot_settings(path) if path is not None else PilotSettings()
        manager = load_manager_config(path) if path is not None else None
    except ConfigError as err:
        raise SettingsError(str(err)) from err
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (section, key, default, _help) in SETTINGS.items():
        raw = given.get(name)
        if raw is not None:
            try:
                values[name] = (port_number(str(raw)) if name == "endpoint_port"
                                else pilot_value(key, str(raw)))
            except ValueError as err:
                raise SettingsError(f"{option_name(name)} {raw}: {err}") from None
            sources[name] = option_name(name)
            continue
        if section == PILOTS_SECTION:
            found = getattr(pilots, key)
        else:
            found = (manager.endpoint.port if manager is not None
                     and "endpoint.port" in manager.given else None)
        if found is not None:
            values[name], sources[name] = found, f"{path} [{section}] {key}"
        else:
            values[name], sources[name] = default, "default"
    if values["listen"] is None:
        from elasticslice.config import cm_is_local
        values["listen"] = default_listen(client.cm_urls)
        if client.cm_urls and cm_is_local(client.cm_urls[0]):
            sources["listen"] = "default: loopback, the CM runs on this machine"
        elif values["listen"] == "127.0.0.1":
            sources["listen"] = "default: loopback, no route to the CM's host was found"
        else:
            sources["listen"] = "default: the address that routes to the CM"
    if max_nodes is not None:
        values["max_nodes"], sources["max_nodes"] = max_nodes, "--max-nodes"
    elif manager is not None and "maxthreshold" in manager.given:
        values["max_nodes"] = manager.maxthreshold
        sources["max_nodes"] = f"{path} [manager] maxthreshold"
    else:
        values["max_nodes"], sources["max_nodes"] = DEFAULT_MAX_NODES, "default"
    cmlist = resolve_cms(given.get("cm") or (), client.cm_urls)
    if cmlist:
        sources["cmlist"] = "--cm"
    return RunSettings(**values, node_python=pilots.node_python, cm_urls=client.cm_urls,
                       manager=manager, sources=sources, cmlist=cmlist)


def resolve_cms(names: Any, cm_urls: Any) -> tuple[str, ...]:
    """``--cm`` (repeatable: a cluster's name such as ``utah``, a part of its URL, or its
    number in ``[protogeni] cm_urls``) as the CMs' URLs, in the order given; one that
    matches no configured CM, or several, is :class:`SettingsError` naming it."""
    out: list[str] = []
    urls = list(cm_urls)
    for name in [names] if isinstance(names, str) else list(names):
        name = str(name).strip()
        if name.isdigit():
            found = [urls[int(name)]] if int(name) < len(urls) else []
        else:
            found = [u for u in urls if u == name] or [u for u in urls if name and name in u]
        if len(found) != 1:
            raise SettingsError(f"--cm {name}: matches {len(found)} of the configured CMs "
                                f"([protogeni] cm_urls: {', '.join(urls) or 'none'})")
        if found[0] not in out:
            out.append(found[0])
    return tuple(out)
