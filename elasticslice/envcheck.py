"""Misspelled ``ELASTICSLICE_*`` variables: warned about once, with the closest known name.

``elasticslice`` reads many variables of this prefix (a config key, ``ELASTICSLICE_<KEY>``;
the manager's and the endpoint's keys; every command-line option,
``ELASTICSLICE_<COMMAND>_<OPTION>``; what the emulator gives a node's startup commands).
A name it does not know would be ignored without a word, so the command line names it on
stderr (a WARNING, once per process and variable) together with the known name closest to
it, when there is one.
"""
from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Iterable, Mapping

import click

from elasticslice import ENV_PREFIX

log = logging.getLogger(__name__)

# Set for commands elasticslice runs, which may run elasticslice in turn: what the emulator
# puts in a node's environment (elasticslice.emulator.boot), its node isolation and node
# network switches, what the manager gives its delete commands
# (elasticslice.managers.deletes), and a node's install its wheelhouse's CA
# (elasticslice.pilots.nodeinstall).
OTHER_VARIABLES = ("NODE_ID", "CLIENT_ID", "HOSTNAME", "NODE_IP", "CORES", "MEMORY",
                   "HARDWARE_TYPE", "SLICE_URN", "SLIVER_URN", "NODE_DIR", "NODE_ISOLATION",
                   "NODE_NETWORK", "DELETE_NODES", "DELETE_CLIENT_IDS", "WHEELHOUSE_CA",
                   "ORPHAN_TIMEOUT",   # how long a manager daemon waits for its workload
                   "RSPEC_READER",     # =python: RSpecs read without the C reader
                   "XMLRPC_READER")    # =python: XML-RPC answers read without their C reader

_warned: set[str] = set()
#: names known without loading the command tree: what elasticslice sets for the commands it
#: runs, the top-level options' (and the config file's keys: :func:`_config_keys`)
_CHEAP = frozenset(ENV_PREFIX + n.upper() for n in (*OTHER_VARIABLES, "config", "debug"))


@functools.cache
def _config_keys() -> frozenset[str]:
    """The variables of the ``[protogeni]`` keys."""
    from elasticslice.config import KNOWN
    return frozenset(ENV_PREFIX + n.upper() for n in KNOWN)


def config_variables() -> set[str]:
    """The variables of the config file's keys: ``[protogeni]``, ``[manager]``, ``[endpoint]``."""
    from elasticslice.config import KNOWN
    from elasticslice.managers.config import DEF_ORDER, ENDPOINT_KEYS, MANAGER_KEYS

    names = {*KNOWN, *MANAGER_KEYS, *OTHER_VARIABLES,
             *(f"endpoint_{k}" for k in ENDPOINT_KEYS), *(f"interval_{m}" for m in DEF_ORDER)}
    return {ENV_PREFIX + n.upper() for n in names}


def option_variables(command: click.Command, prefix: str) -> set[str]:
    """Every variable click reads for ``command``'s options and its sub-commands' (the
    automatic ``PREFIX_<OPTION>`` and any explicit ``envvar``)."""
    prefix = prefix.upper().replace("-", "_")
    names: set[str] = set()
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        if param.envvar:
            names.update([param.envvar] if isinstance(param.envvar, str) else param.envvar)
        if param.allow_from_autoenv and param.name:
            names.add(f"{prefix}_{param.name.upper()}")
    if isinstance(command, click.Group):
        load_all = getattr(command, "load_all", None)
        if load_all is not None:  # a group that imports its commands when asked for
            load_all()
        for name, sub in command.commands.items():
            names |= option_variables(sub, f"{prefix}_{name}")
    return names


def _option_of_its_command(group: click.Command, prefix: str, name: str) -> bool:
    """Whether ``name`` is a variable of an option of the command its name starts with
    (``ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY``: ``emulator serve --boot-delay``), importing
    only that command's module: loading the whole command tree to check one such variable
    cost every command line ~0.4 s of CPU where one was set (the doc tests set one for
    every command they run)."""
    if not isinstance(group, click.Group):
        return False
    rest = name[len(prefix) + 1:] if name.startswith(prefix.upper() + "_") else ""
    ctx = click.Context(group)
    for sub in group.list_commands(ctx):
        key = sub.upper().replace("-", "_") + "_"
        if rest.startswith(key):
            command = group.get_command(ctx, sub)
            if command is not None and name in option_variables(command, f"{prefix}_{sub}"):
                return True
    return False


def unknown_variables(env: Mapping[str, str], known: Iterable[str]) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for each ``ELASTICSLICE_*`` name of ``env`` that
    is not in ``known``, sorted."""
    known = set(known)
    # compared without the prefix, which every name shares
    suffixes = {k[len(ENV_PREFIX):]: k for k in known if k.startswith(ENV_PREFIX)}
    out: list[tuple[str, str | None]] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        close = difflib.get_close_matches(name[len(ENV_PREFIX):], suffixes, n=1, cutoff=0.7)
        out.append((name, suffixes[close[0]] if close else None))
    return out


def warn_unknown_variables(command: click.Command, prefix: str = "ELASTICSLICE",
                           env: Mapping[str, str] | None = None) -> list[str]:
    """Log one WARNING per unknown ``ELASTICSLICE_*`` variable (once per process); returns the
    messages logged by this call."""
    env = os.environ if env is None else env
    ours = [n for n in env if n.startswith(ENV_PREFIX) and n not in _CHEAP]
    if all(n in _config_keys() or _option_of_its_command(command, prefix, n) for n in ours):
        return []  # nothing to look up (the usual case: no command tree to load)
    known = config_variables() | option_variables(command, prefix)
    messages = []
    for name, close in unknown_variables(env, known):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"; did you mean ${close}?" if close else ""
        messages.append(f"${name} is not a variable elasticslice reads: ignored{hint}")
        log.warning("%s", messages[-1])
    return messages
