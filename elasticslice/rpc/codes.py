"""GENI response codes (GENIRESPONSE_*) as CloudLab sends them, normalised once into an Enum."""
from __future__ import annotations

from enum import IntEnum


class GeniCode(IntEnum):
    SUCCESS = 0
    BADARGS = 1
    ERROR = 2
    FORBIDDEN = 3
    BADVERSION = 4
    SERVERERROR = 5
    TOOBIG = 6
    REFUSED = 7
    TIMEDOUT = 8
    DBERROR = 9
    RPCERROR = 10
    UNAVAILABLE = 11
    SEARCHFAILED = 12
    UNSUPPORTED = 13
    BUSY = 14
    EXPIRED = 15
    INPROGRESS = 16
    ALREADYEXISTS = 17
    NOSPACE = 23
    VLAN_UNAVAILABLE = 24
    INSUFFICIENT_BANDWIDTH = 25
    INSUFFICIENT_NODES = 26
    INSUFFICIENT_MEMORY = 27
    NO_MAPPING = 28
    NO_CONNECT = 29
    MAPPING_IMPOSSIBLE = 30
    NETWORK_ERROR = 35
    NOT_IMPLEMENTED = 100
    STITCHER_ERROR = 101
    SETUPFAILURE_BOOTFAILED = 150
    SETUPFAILURE_OSSETUP = 151
    SETUPFAILURE_NETWORK = 152
    SETUPFAILURE_EVENTSYS = 153
    SETUPFAILURE_INTERRUPTED = 154
    SETUPFAILURE = 155
    SETUPFAILURE_MAXERROR = 170
    SERVER_UNAVAILABLE = 503

    @classmethod
    def name_of(cls, code: int) -> str:
        try:
            return cls(code).name
        except ValueError:
            return f"CODE{code}"


# Worth a retry with backoff (PROTOCOL.md): BUSY, TIMEDOUT, RPCERROR, 503.
TRANSIENT_CODES = frozenset({GeniCode.BUSY, GeniCode.TIMEDOUT, GeniCode.RPCERROR,
                             GeniCode.SERVER_UNAVAILABLE})

# XML-RPC transport-level fault codes used by the ProtoGENI servers.
FAULT_PARSE = -32700
FAULT_CERT_OR_MODULE = -32500
FAULT_NO_SUCH_METHOD = -32497
FAULT_SERVER_EXCEPTION = -32600
FAULT_CRASH = -32400
FAULT_OVERLOADED = 503
