"""elasticslice: elastic CloudLab/ProtoGENI slices that host Troy pilots.

Sub-packages: ``rpc`` (ProtoGENI XML-RPC over TLS), ``rspec`` (GENI RSpec v3 build/parse),
``emulator`` (CloudLab in a box), ``managers`` (the elastic slice manager).
"""
from __future__ import annotations

from elasticslice.errors import ConfigError, ElasticSliceError, RPCError, RSpecError

__version__ = "0.1.0"
__all__ = ["ElasticSliceError", "ConfigError", "RPCError", "RSpecError", "__version__"]
