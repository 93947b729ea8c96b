"""From an HTTP request to a service method and back: paths, XML-RPC, identity, faults.

Paths: ``[/project/<pid>]/protogeni/xmlrpc/<module>`` with module ``sa``, ``cm`` (CM 2.0),
``cm/2.0``, ``dynslice`` (the dynamic-slice server) and ``admin`` (the emulator's own admin
certificate only); in a box of several CMs (clusters.py), a cluster's own modules (all but
``sa``) at ``/cluster/<name>/protogeni/xmlrpc/<module>``. Every call takes one struct; the
dynamic-slice calls also accept their documented positional arguments. Transport faults use
ProtoGENI's codes.

Bodies are decoded as they arrive (``decode``): the parser coalesces text into large pieces
and nothing keeps the raw bytes, so a call costs about twice its largest string, not the
several times a buffered ``xmlrpc.client.loads`` of entity-heavy text (an RSpec) costs. A
DOCTYPE is refused: XML-RPC has no use for one.
"""
from __future__ import annotations

import logging
import re
import time
import traceback
import xmlrpc.client
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.parsers import expat

from elasticslice.emulator.bounds import Body, BodyError
from elasticslice.emulator.faults import Fault, FaultInjector
from elasticslice.emulator.geni import GeniFault, response
from elasticslice.emulator.pressure import Pressure
from elasticslice.emulator.pace import Latency
from elasticslice.emulator.server import Peer
from elasticslice.rpc.codes import (FAULT_CERT_OR_MODULE, FAULT_NO_SUCH_METHOD, FAULT_PARSE,
                                    FAULT_SERVER_EXCEPTION, GeniCode)

log = logging.getLogger(__name__)

PATH = re.compile(r"^(?:/cluster/([^/]+))?(?:/project/[^/]+)?/protogeni/xmlrpc/"
                  r"(sa|cm|cm/2\.0|dynslice|admin)/?$")
MODULE_ALIASES = {"cm/2.0": "cm"}


@dataclass(frozen=True)
class Call:
    """One decoded call as a service method sees it."""

    module: str
    method: str
    params: dict[str, Any]
    caller: str
    cert_pem: str


Handler = Callable[[Call], Any]


class Service:
    """A module's methods: subclasses list them in ``METHODS`` and define them by name.

    ``POSITIONAL`` maps a method to its positional parameter names, for calls that are
    documented with plain arguments rather than one struct.
    """

    METHODS: frozenset[str] = frozenset()
    POSITIONAL: dict[str, tuple[str, ...]] = {}
    module = ""

    def handler(self, method: str) -> Handler | None:
        if method not in self.METHODS:
            return None
        return getattr(self, method)


class _Unmarshaller(xmlrpc.client.Unmarshaller):
    """The stdlib unmarshaller, minus a copy: it joins the text of an element again at every
    end tag (``</string></value>`` made a second copy of the largest string)."""

    def end(self, tag: str) -> None:
        super().end(tag)
        self._data: list[str] = []


def _no_doctype(*_: Any) -> None:
    raise ValueError("a DOCTYPE is not allowed in an XML-RPC call")


def decode(body: Body) -> tuple[tuple[Any, ...], str | None]:
    """Params and method name of an XML-RPC call, parsed chunk by chunk as the body arrives.

    Raises ``BodyError`` when the body cannot be read, anything else when it is not a call
    (including a methodName other than the one the size limit was chosen by)."""
    target = _Unmarshaller(use_builtin_types=False)
    parser = expat.ParserCreate(None, None)
    parser.buffer_text = True
    parser.buffer_size = 1 << 20
    parser.StartElementHandler = target.start
    parser.EndElementHandler = target.end
    parser.CharacterDataHandler = target.data
    parser.StartDoctypeDeclHandler = _no_doctype
    target.xml(None, None)
    for chunk in body.chunks():
        parser.Parse(chunk, False)
    parser.Parse(b"", True)
    params, method = target.close(), target.getmethodname()
    if body.method is not None and method != body.method:
        raise ValueError("methodName must come once, at the start of the call")
    return params, method


def _fault(code: int, message: str) -> bytes:
    return xmlrpc.client.dumps(xmlrpc.client.Fault(code, message), methodresponse=True,
                               encoding="utf-8").encode("utf-8")


def _clean(value: Any) -> Any:
    """XML-RPC cannot carry None; tuples travel as arrays."""
    if value is None:
        return 0
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class EmulatorDispatcher:
    """Routes calls to services; checks identity; applies fault injection; logs each call."""

    def __init__(self, services: list[Service], faults: FaultInjector, admin_urn: str,
                 pressure: Pressure | None = None, latency: Latency | None = None,
                 clusters: dict[str, list[Service]] | None = None) -> None:
        self.services = {s.module: s for s in services}
        self.clusters = {name: {s.module: s for s in found}
                         for name, found in (clusters or {}).items()}
        self.home = next(iter(self.clusters), "")  # the cluster also at the SA's paths
        self.faults = faults
        self.pressure = pressure or Pressure()
        self.admin_urn = admin_urn
        self.latency = latency  # serve --latency: CloudLab's pace (pace.py)
        self.calls = 0

    def dispatch(self, path: str, body: Body, peer: Peer) -> tuple[int, bytes]:
        self.calls += 1
        match = PATH.match(path.split("?", 1)[0])
        if match is None:
            return 200, _fault(FAULT_CERT_OR_MODULE, f"No such module: {path}")
        module = MODULE_ALIASES.get(match.group(2), match.group(2))
        services, cluster = self.services, (self.home if module != "sa" else "")
        if match.group(1) is not None:
            cluster = match.group(1)
            services = self.clusters.get(match.group(1), {})
            if module not in services:
                return 200, _fault(FAULT_CERT_OR_MODULE, f"No such module: {path}")
        if not peer.urn:
            return 200, _fault(FAULT_CERT_OR_MODULE, "Could not get uuid/urn from certificate")
        if module == "admin" and peer.urn != self.admin_urn:
            return 200, _fault(FAULT_CERT_OR_MODULE, "Admin calls need the emulator's admin "
                                                     "certificate")
        try:
            args, method = decode(body)
        except BodyError:
            raise  # the connection is broken: nobody to answer
        except Exception as err:  # expat errors, bad values: all one parse fault
            return 200, _fault(FAULT_PARSE, f"parse error: {err}")
        service = services.get(module)
        handler = service.handler(method or "") if service else None
        if service is None or handler is None:
            return 200, _fault(FAULT_NO_SUCH_METHOD, f"No such method: {method}")
        if module != "admin":
            fault = self.faults.for_call(method)
            if fault is Fault.UNAVAILABLE:
                return 503, _fault(503, "Server is overloaded; try again later")
            if fault is Fault.BUSY:
                return 200, self._reply(response(0, GeniCode.BUSY, "Server is busy; try again"))
            if fault is Fault.SLOW:
                time.sleep(self.faults.slow_seconds)
            # --busy answers at once, --slow waits (at this cluster, or everywhere)
            if self.pressure.apply(module, method, cluster):
                return 200, self._reply(response(0, GeniCode.BUSY, "Server is busy; try again"))
        if self.latency is not None and module == "cm":
            self.latency.pause(method)
        try:
            params = self._params(service, method, args)
        except GeniFault as err:
            return 200, self._reply(response(err.value, err.code, err.output))
        started = time.monotonic()
        try:
            value = handler(Call(module, method, params, peer.urn, peer.cert_pem))
            result = response(value)
        except GeniFault as err:
            result = response(err.value, err.code, err.output)
            # The traceback's frames hold the call (its params can be a 60 MB RSpec) in a
            # cycle that only the garbage collector would break, some calls later.
            traceback.clear_frames(err.__traceback__)
        except Exception as err:
            log.exception("%s.%s from %s failed", module, method, peer.urn)
            traceback.clear_frames(err.__traceback__)
            return 200, _fault(FAULT_SERVER_EXCEPTION, f"Server exception in {method}")
        log.debug("%s.%s from %s: code %s in %.1f ms", module, method, peer.urn,
                  result["code"], (time.monotonic() - started) * 1000)
        return 200, self._reply(result)

    @staticmethod
    def _params(service: Service, method: str, args: tuple[Any, ...]) -> dict[str, Any]:
        if not args:
            return {}
        if len(args) == 1 and isinstance(args[0], dict):
            return args[0]
        names = service.POSITIONAL.get(method)
        if names and len(args) <= len(names):
            return dict(zip(names, args))
        raise GeniFault(GeniCode.BADARGS, f"{method} takes one struct argument")

    @staticmethod
    def _reply(result: dict[str, Any]) -> bytes:
        return xmlrpc.client.dumps((_clean(result),), methodresponse=True, allow_none=False,
                                   encoding="utf-8").encode("utf-8")
