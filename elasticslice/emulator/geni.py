"""ProtoGENI response structs and the exception the emulator's handlers raise for a code."""
from __future__ import annotations

from typing import Any

from elasticslice.rpc.codes import GeniCode

MAX_OUTPUT = 1024  # characters of a refusal's output


class GeniFault(Exception):
    """A handler's refusal: becomes ``{code, value: 0, output}`` for the caller."""

    def __init__(self, code: GeniCode, output: str, value: Any = 0) -> None:
        if len(output) > MAX_OUTPUT:  # a message quoting a hostile argument stays short
            output = output[:MAX_OUTPUT] + "... (truncated)"
        super().__init__(f"{code.name}: {output}")
        self.code = code
        self.output = output
        self.value = value


def response(value: Any = 0, code: GeniCode = GeniCode.SUCCESS, output: str = "") -> dict:
    """The ProtoGENI answer struct; an undefined value travels as 0."""
    return {"code": int(code), "value": 0 if value is None else value, "output": output}


def require(params: dict, name: str, kind: type | tuple[type, ...] = str) -> Any:
    """A mandatory argument of the given type, or BADARGS naming it."""
    if name not in params:
        raise GeniFault(GeniCode.BADARGS, f"Missing argument: {name}")
    value = params[name]
    if not isinstance(value, kind):
        raise GeniFault(GeniCode.BADARGS, f"Malformed argument: {name}")
    return value


def optional(params: dict, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """An optional argument of the given type, or BADARGS naming it."""
    if name not in params or params[name] is None:
        return default
    value = params[name]
    if not isinstance(value, kind):
        raise GeniFault(GeniCode.BADARGS, f"Malformed argument: {name}")
    return value
