"""The slice authority (``/sa``): credentials, slices, users and keys."""
from __future__ import annotations

import datetime as dt
import logging
import xmlrpc.client
from typing import Any

from elasticslice.emulator.authority import (Privilege, Urn, from_epoch, new_uuid, stable_uuid,
                                             utcnow)
from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Call, Service
from elasticslice.emulator.geni import GeniFault, optional, require
from elasticslice.emulator.store import SliceRow
from elasticslice.isotime import parse_iso
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import Credential

log = logging.getLogger(__name__)

SA_VERSION = 1.01
MIN_AHEAD = dt.timedelta(minutes=5)
USER_CREDENTIAL_LIFETIME = dt.timedelta(days=7)


def parse_expiration(value: Any, name: str = "expiration") -> dt.datetime:
    """ISO-8601 (``Z`` or offset; naive means UTC), ``%Y%m%dT%H:%M:%S``, or XML-RPC dateTime.

    A date that is not a moment in years 1..9999 UTC (``0001-01-01T00:00:00+05:00``) is
    BADARGS, like any unreadable one.
    """
    if isinstance(value, xmlrpc.client.DateTime):
        value = value.value
    if not isinstance(value, str) or not value.strip():
        raise GeniFault(GeniCode.BADARGS, f"Malformed argument: {name}")
    text = value.strip()
    when = None
    for fmt in ("%Y%m%dT%H:%M:%S", "%Y%m%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S GMT"):
        try:
            when = dt.datetime.strptime(text, fmt)
            break
        except ValueError:
            continue
    if when is None:
        try:
            when = parse_iso(text)
        except ValueError as err:
            raise GeniFault(GeniCode.BADARGS, f"Could not parse {name}: {text}") from err
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    try:
        return when.astimezone(dt.timezone.utc)
    except OverflowError as err:
        raise GeniFault(GeniCode.BADARGS, f"{name} out of range (years 1 to 9999 UTC): "
                                          f"{text}") from err


class SliceAuthority(Service):
    """SA methods as CloudLab's SA answers them."""

    module = "sa"
    METHODS = frozenset({"GetVersion", "GetCredential", "Resolve", "Register", "RenewSlice",
                         "GetKeys"})

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # ---- helpers
    def _remember(self, call: Call) -> None:
        key = f"user:{call.caller}"
        if self.ctx.store.get_meta(key) is None:
            self.ctx.store.set_meta(key, call.cert_pem)

    def _self_credential_check(self, call: Call) -> None:
        xml = require(call.params, "credential")
        cred = self.ctx.authority.verify(xml, call.caller)
        if cred.target_urn != call.caller:
            raise GeniFault(GeniCode.FORBIDDEN, "Not a user credential for you")

    def _slice_urn(self, params: dict[str, Any]) -> str:
        return self.ctx.identity.slice_urn_from(optional(params, "urn", str),
                                                optional(params, "hrn", str))

    def _slice(self, params: dict[str, Any]) -> SliceRow:
        urn = self._slice_urn(params)
        row = self.ctx.store.get_slice(urn)
        if row is None or row.expires <= self.ctx.clock():
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice: {urn}")
        return row

    def slice_credential(self, row: SliceRow, call: Call,
                         presented: Credential | None = None) -> str:
        """A slice credential for the caller: in full for the slice's creator, else (a
        delegate) within the credential presented."""
        within = presented if call.caller != row.creator_urn else None
        return self.ctx.authority.credential(call.cert_pem, call.caller, row.gid, row.urn,
                                             from_epoch(row.expires), within=within)

    def _check_type(self, params: dict[str, Any], allowed: tuple[str, ...]) -> str:
        kind = str(require(params, "type")).lower()
        if kind not in allowed:
            raise GeniFault(GeniCode.BADARGS, f"Unknown type: {params['type']}")
        return kind

    # ---- methods
    def GetVersion(self, call: Call) -> Any:  # noqa: N802 (ProtoGENI method names)
        return SA_VERSION

    def GetCredential(self, call: Call) -> Any:  # noqa: N802
        self._remember(call)
        params = call.params
        if "type" not in params and "urn" not in params and "hrn" not in params:
            expires = utcnow() + USER_CREDENTIAL_LIFETIME
            return self.ctx.authority.credential(call.cert_pem, call.caller, call.cert_pem,
                                                 call.caller, expires)
        self._check_type(params, ("slice",))
        self._self_credential_check(call)
        row = self._slice(params)
        if row.creator_urn != call.caller:
            raise GeniFault(GeniCode.FORBIDDEN, f"Not your slice: {row.urn}")
        return self.slice_credential(row, call)

    def Resolve(self, call: Call) -> Any:  # noqa: N802
        params = call.params
        self._self_credential_check(call)
        kind = self._check_type(params, ("slice", "user"))
        if kind == "slice":
            row = self._slice(params)
            cms = [cm.identity.cm_urn for cm in self.ctx.box  # every CM holding a sliver
                   if cm.store.get_sliver(row.urn) is not None]
            return {"hrn": f"{Urn.parse(row.urn).authority}.{row.hrn}",  # type: ignore[union-attr]
                    "urn": row.urn, "uuid": row.uuid, "creator_uuid": stable_uuid(row.creator_urn),
                    "creator_urn": row.creator_urn, "gid": row.gid,
                    "component_managers": cms}
        return self._resolve_user(call)

    def _resolve_user(self, call: Call) -> dict[str, Any]:
        params = call.params
        urn = optional(params, "urn", str)
        if not urn:
            hrn = str(require(params, "hrn"))
            authority, _, uid = hrn.rpartition(".")
            urn = f"urn:publicid:IDN+{authority or self.ctx.identity.domain}+user+{uid}"
        gid = self.ctx.store.get_meta(f"user:{urn}")
        if gid is None and urn == call.caller:
            gid = call.cert_pem
        if gid is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such user: {urn}")
        parsed = Urn.parse(urn)
        assert parsed is not None
        slices = [s.urn for s in self.ctx.store.slices_of(urn) if s.expires > self.ctx.clock()]
        return {"uid": parsed.name, "hrn": f"{parsed.authority}.{parsed.name}", "urn": urn,
                "uuid": stable_uuid(urn), "email": f"{parsed.name}@{parsed.authority}", "gid": gid,
                "name": parsed.name, "slices": slices, "pubkeys": self._keys()}

    def Register(self, call: Call) -> Any:  # noqa: N802
        params = call.params
        self._self_credential_check(call)
        self._check_type(params, ("slice",))
        urn = self._slice_urn(params)
        name = self.ctx.identity.check_slice_urn(urn)
        now = utcnow()
        settings = self.ctx.settings
        if params.get("expiration"):
            expires = parse_expiration(params["expiration"])
        else:
            expires = now + dt.timedelta(hours=settings.default_slice_hours)
        self._check_expiration(expires, now)
        with self.ctx.lock:
            existing = self.ctx.store.get_slice(urn)
            if existing is not None and existing.expires > self.ctx.clock():
                raise GeniFault(GeniCode.ERROR, f"Slice already exists: {urn}")
            row = SliceRow(urn, name, new_uuid(), call.caller, expires.timestamp(),
                           self.ctx.clock(), self.ctx.authority.slice_gid(urn))
            self.ctx.store.put_slice(row)
        self._remember(call)
        log.info("slice %s registered by %s until %s", urn, call.caller, expires)
        return self.slice_credential(row, call)

    def _check_expiration(self, expires: dt.datetime, now: dt.datetime,
                          code: GeniCode = GeniCode.BADARGS) -> None:
        """Register refuses with BADARGS, RenewSlice with ERROR (as CloudLab's SA does)."""
        if expires <= now:
            raise GeniFault(code, "Expiration is in the past")
        if expires < now + MIN_AHEAD:
            raise GeniFault(code, "Expiration must be at least 5 minutes ahead "
                                  "(such a short life for a slice)")
        limit = now + dt.timedelta(days=self.ctx.settings.max_slice_days)
        if expires > limit + dt.timedelta(minutes=1):
            raise GeniFault(code, "Expiration is past the maximum slice lifetime "
                                  f"({self.ctx.settings.max_slice_days:g} days)")

    def RenewSlice(self, call: Call) -> Any:  # noqa: N802
        params = call.params
        cred = self.ctx.authority.verify(require(params, "credential"), call.caller,
                                         Privilege.CONTROL)
        parsed = Urn.parse(cred.target_urn)
        if parsed is None or parsed.kind != "slice":
            raise GeniFault(GeniCode.BADARGS, "RenewSlice needs a slice credential")
        expires = parse_expiration(require(params, "expiration", (str, xmlrpc.client.DateTime)))
        with self.ctx.lock:
            row = self.ctx.store.get_slice(cred.target_urn)
            if row is None:
                raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice: {cred.target_urn}")
            self._check_expiration(expires, utcnow(), GeniCode.ERROR)
            if expires.timestamp() < row.expires:
                raise GeniFault(GeniCode.ERROR, "Cannot shorten slice lifetime")
            row.expires = expires.timestamp()
            self.ctx.store.put_slice(row)
        return self.slice_credential(row, call, cred)

    def _keys(self) -> list[str]:
        path = self.ctx.directory / "user-ssh.pub"
        return [path.read_text().strip()] if path.exists() else []

    def GetKeys(self, call: Call) -> Any:  # noqa: N802
        self._self_credential_check(call)
        version = call.params.get("version", 1)
        keys = [{"type": "ssh", "key": k} for k in self._keys()]
        if str(version) in ("2", "2.0"):
            return [{"urn": call.caller, "login": call.caller.rsplit("+", 1)[-1],
                     "keys": keys}]
        return keys
