"""elasticslice: elastic CloudLab/ProtoGENI slices that host Troy pilots.

Sub-packages: ``rpc`` (ProtoGENI XML-RPC over TLS), ``rspec`` (GENI RSpec v3 build/parse),
``emulator`` (CloudLab in a box), ``managers`` (the elastic slice manager).
"""
from __future__ import annotations

from elasticslice.errors import ConfigError, ElasticSliceError, RPCError, RSpecError

__version__ = "0.1.0"
#: every environment variable elasticslice reads starts with it (the config's keys,
#: every command-line option's; elasticslice.envcheck warns of unknown ones)
ENV_PREFIX = "ELASTICSLICE_"
__all__ = ["ElasticSliceError", "ConfigError", "RPCError", "RSpecError", "__version__"]
