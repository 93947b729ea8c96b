"""The error hierarchy of the CloudLab side: one root, one subclass per layer.

Every layer translates foreign exceptions (lxml, ssl, xmlrpc, sqlite) into one of these,
with ``raise ... from err``, so that the CLI can show one clear line and the manager's cycle
can log with context and go on. :func:`os_error_reason` says why a file could not be read
(kept here, free of heavy imports: the config and the command line use it).
"""
from __future__ import annotations

import os


class ElasticSliceError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(ElasticSliceError):
    """A configuration value is missing or wrong; names the key and the file."""

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None) -> None:
        self.key = key
        self.path = path
        where = ""
        if path and key:
            where = f"{path}: [{key}] "
        elif path:
            where = f"{path}: "
        elif key:
            where = f"[{key}] "
        super().__init__(f"{where}{message}")


class RSpecError(ElasticSliceError):
    """An RSpec is unreadable, hostile, or invalid; carries the source and line when known."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None) -> None:
        self.source = source
        self.line = line
        prefix = ""
        if source:
            prefix = f"{source}:{line}: " if line else f"{source}: "
        elif line:
            prefix = f"line {line}: "
        super().__init__(f"{prefix}{message}")


class HostileXMLError(RSpecError):
    """The XML tried something we refuse: a DTD, entities, external references, or size."""


class RPCError(ElasticSliceError):
    """A ProtoGENI call failed. ``code`` is the GENI response code (or XML-RPC fault code)."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        method: str | None = None,
        server: str | None = None,
        output: str | None = None,
    ) -> None:
        self.code = code
        self.method = method
        self.server = server
        self.output = output
        parts = []
        if method:
            parts.append(method)
        if server:
            parts.append(f"at {server}")
        head = " ".join(parts)
        detail = f" (code {code})" if code is not None else ""
        super().__init__(f"{head}{detail}: {message}" if head else f"{message}{detail}")


class TransportError(RPCError):
    """The call never got a ProtoGENI answer: TLS, connection, HTTP or XML-RPC fault."""


class CredentialError(ElasticSliceError):
    """A credential could not be parsed, signed, or verified."""


def os_error_reason(path: str | os.PathLike[str], err: OSError) -> str:
    """Why ``path`` could not be read, in words a user acts on (one line, names the path)."""
    if isinstance(err, FileNotFoundError):
        return f"no such file: {path}"
    if isinstance(err, IsADirectoryError):
        return f"{path} is a directory, not a file"
    if isinstance(err, NotADirectoryError):
        return f"no such file: {path} (part of the path is a file, not a directory)"
    if isinstance(err, PermissionError):
        return f"cannot read {path}: permission denied"
    return f"cannot read {path}: {err.strerror or err}"
