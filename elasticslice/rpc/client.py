"""``ProtoGeniServer``: one user's view of a slice authority and its component managers.

    server = ProtoGeniServer(load_config(path))
    server.register_slice()                      # SA Register (slice from the config)
    cred, manifest = server.create_sliver(rspec) # first CM; server.cm("wisc") for another
    server.sliver_status()
    server.close()

Construction does no I/O: the certificate, passphrase and TLS context are loaded on the
first call. Self and slice credentials are cached (memory and disk, 0600) until five
minutes before they expire; a cached credential the server refuses is fetched anew once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from elasticslice.config import ClientConfig, load_passphrase
from elasticslice.errors import ConfigError, CredentialError, RPCError
from elasticslice.rpc.cache import CredentialCache
from elasticslice.rpc.cm import ComponentManager, SliverStatus, format_expiration
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.timings import CallTimings
from elasticslice.rpc.transport import RetryPolicy, XmlRpcTransport, make_ssl_context

log = logging.getLogger(__name__)

T = TypeVar("T")
REFETCH_CODES = frozenset({GeniCode.FORBIDDEN, GeniCode.EXPIRED})


def slice_urn_for(domain: str, name: str, project: str | None = None) -> str:
    authority = f"{domain}:{project}" if project else domain
    return f"urn:publicid:IDN+{authority}+slice+{name}"


class ProtoGeniServer:
    """SA + CM v2 + dynamic-slice calls for the user of ``config``.

    SA methods are on this object; CM methods take ``cm=`` (None: the first CM; an index;
    or a string matching a CM's URL or host) or are reached through :meth:`cm`.
    """

    def __init__(self, config: ClientConfig, *, passphrase: str | None = None,
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] | None = None
                 ) -> None:
        self.config = config
        self._passphrase = passphrase
        self._retry = retry or RetryPolicy(attempts=config.retries + 1,
                                           base_delay=config.retry_delay,
                                           max_delay=config.retry_max_delay)
        self._sleep = sleep
        self._transport: XmlRpcTransport | None = None
        self._user_urn: str | None = None
        self._owner: str | None = None
        self._sa_url: str | None = config.sa_url
        self._lock = threading.RLock()
        self.cache = CredentialCache(config.credential_cache_dir)
        #: how long each call took, by method, across transports (kept when one is closed)
        self.call_timings = CallTimings()
        self.cms = [ComponentManager(self, url, dyn)
                    for url, dyn in zip(config.cm_urls, config.dynslice_urls
                                        or [None] * len(config.cm_urls))]

    # ------------------------------------------------------------------ plumbing
    @property
    def transport(self) -> XmlRpcTransport:
        with self._lock:
            if self._transport is None:
                phrase = self._passphrase
                if phrase is None:
                    phrase = load_passphrase(self.config)
                try:
                    ctx = make_ssl_context(self.config.certificate, phrase,
                                           self.config.ca_bundle, self.config.verify)
                except CredentialError as err:
                    key = "ca_bundle" if "CA bundle" in str(err) else "certificate"
                    raise self.config.error(str(err), key) from err
                kwargs = {"sleep": self._sleep} if self._sleep else {}
                self._transport = XmlRpcTransport(ctx, timeout=self.config.timeout,
                                                  retry=self._retry, timings=self.call_timings,
                                                  **kwargs)
            return self._transport

    @contextlib.contextmanager
    def fewer_retries(self, attempts: int = 2) -> Iterator[None]:
        """Within the block, this thread's calls are tried at most ``attempts`` times (a
        BUSY or unreachable CM fails sooner): for a caller that backs off on its own, the
        manager over several CMs, whose other CMs must not wait out one CM's retries."""
        policy = dataclasses.replace(self._retry, attempts=max(1, min(attempts,
                                                                      self._retry.attempts)))
        with self.transport.retrying(policy):
            yield

    def close(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    def __enter__(self) -> ProtoGeniServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_user_cert(self) -> None:
        # imported here: cryptography costs every command ~0.05 s of CPU, and a call to a
        # configured sa_url that needs no credential (GetVersion) never reads the certificate
        from cryptography.hazmat.primitives import serialization

        from elasticslice.rpc import pki
        try:
            data = self.config.certificate.read_bytes()
            urn = pki.urn_from_certificate(data)
            aia = pki.aia_url_from_certificate(data)
        except (OSError, CredentialError) as err:
            raise self.config.error(f"cannot read the user certificate: {err}",
                                    "certificate") from err
        if not urn:
            raise self.config.error("the certificate has no urn:publicid:IDN subjectAltName",
                                    "certificate")
        self._user_urn = urn
        # Cache entries belong to this certificate: a new certificate (a re-initialised
        # emulator, a renewed CloudLab account) never sees the old one's credentials.
        fingerprint = hashlib.sha256(pki.load_pem_cert(data).public_bytes(
            serialization.Encoding.DER)).hexdigest()[:16]
        self._owner = f"{urn}#{fingerprint}"
        if self._sa_url is None:
            if not aia:
                raise self.config.error("missing, and the certificate names no SA "
                                        "(authorityInfoAccess)", "sa_url")
            self._sa_url = aia

    @property
    def user_urn(self) -> str:
        if self._user_urn is None:
            self._read_user_cert()
        assert self._user_urn is not None
        return self._user_urn

    @property
    def owner(self) -> str:
        """The credential-cache key of this user and certificate."""
        if self._owner is None:
            self._read_user_cert()
        assert self._owner is not None
        return self._owner

    @property
    def domain(self) -> str:
        """The SA's domain: the authority of the user's URN."""
        from elasticslice.rpc.pki import urn_authority
        return urn_authority(self.user_urn).split(":", 1)[0]

    @property
    def sa_url(self) -> str:
        if self._sa_url is None:
            self._read_user_cert()
        assert self._sa_url is not None
        return self._sa_url

    def slice_urn(self, name: str | None = None) -> str:
        """The URN of slice ``name`` (default: the configured one) at the user's SA."""
        return slice_urn_for(self.domain, name or self.config.require_slice_name(),
                             self.config.project)

    def cm(self, which: int | str | None = None) -> ComponentManager:
        if which is None or which == "":
            return self.cms[0]
        if isinstance(which, int):
            try:
                return self.cms[which]
            except IndexError:
                raise ConfigError(f"no CM number {which} (have {len(self.cms)})",
                                  key="cm_urls", path=str(self.config.path)) from None
        matches = [c for c in self.cms if which == c.url] or [c for c in self.cms
                                                              if which in c.url]
        if len(matches) != 1:
            raise ConfigError(f"{which!r} matches {len(matches)} of the configured CMs "
                              f"({', '.join(c.url for c in self.cms)})",
                              key="cm_urls", path=str(self.config.path))
        return matches[0]

    def sa_call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One raw SA call; the value on SUCCESS, else RPCError."""
        return self.transport.call(self.sa_url, method, params or {})

    def with_credential(self, target: str, fetch: Callable[[], str],
                        use: Callable[[str], T]) -> T:
        """``use(credential)``, fetching it anew once if a cached one is refused."""
        cached = self.cache.get(self.owner, target)
        cred = cached if cached is not None else self._store(target, fetch())
        try:
            return use(cred)
        except RPCError as err:
            if cached is None or err.code not in REFETCH_CODES:
                raise
            log.info("cached credential for %s refused (%s); fetching a new one", target,
                     GeniCode.name_of(err.code or 0))
            self.cache.drop(self.owner, target)
            return use(self._store(target, fetch()))

    def _store(self, target: str, cred: Any) -> str:
        if not isinstance(cred, str):
            raise RPCError("the server answered something that is not a credential",
                           server=self.sa_url)
        self.cache.put(self.owner, target, cred)
        return cred

    # ------------------------------------------------------------------ slice authority
    def get_version(self) -> Any:
        """SA GetVersion (CloudLab: 1.01)."""
        return self.sa_call("GetVersion")

    def get_credential(self) -> str:
        """The user's self credential (cached)."""
        with self._lock:
            cached = self.cache.get(self.owner, self.user_urn)
            if cached is not None:
                return cached
            return self._store(self.user_urn, self.sa_call("GetCredential"))

    def _with_self(self, use: Callable[[str], T]) -> T:
        return self.with_credential(self.user_urn, lambda: self.sa_call("GetCredential"), use)

    def get_slice_credential(self, urn: str | None = None) -> str:
        """The slice credential (cached); SEARCHFAILED if there is no such slice."""
        urn = urn or self.slice_urn()
        with self._lock:
            cached = self.cache.get(self.owner, urn)
            if cached is not None:
                return cached
            return self._store(urn, self._fetch_slice_credential(urn))

    def _fetch_slice_credential(self, urn: str) -> str:
        return self._with_self(lambda c: self.sa_call(
            "GetCredential", {"credential": c, "type": "Slice", "urn": urn}))

    def with_slice_credential(self, use: Callable[[str], T], urn: str | None = None) -> T:
        urn = urn or self.slice_urn()
        self.get_slice_credential(urn)
        return self.with_credential(urn, lambda: self._fetch_slice_credential(urn), use)

    def _resolve(self, kind: str, name: str) -> dict[str, Any]:
        from elasticslice.rpc.pki import URN_PREFIX
        key = "urn" if name.startswith(URN_PREFIX) else "hrn"
        return self._with_self(lambda c: self.sa_call(
            "Resolve", {"credential": c, "type": kind, key: name}))

    def resolve_slice(self, urn_or_hrn: str | None = None) -> dict[str, Any]:
        return self._resolve("Slice", urn_or_hrn or self.slice_urn())

    def resolve_user(self, urn_or_hrn: str | None = None) -> dict[str, Any]:
        return self._resolve("User", urn_or_hrn or self.user_urn)

    def register_slice(self, name: str | None = None,
                       expiration: dt.datetime | None = None) -> str:
        """Register a slice; returns (and caches) its credential. ERROR if it exists."""
        urn = self.slice_urn(name)
        params: dict[str, Any] = {"type": "Slice", "urn": urn}
        if expiration is not None:
            params["expiration"] = format_expiration(expiration)
        cred = self._with_self(lambda c: self.sa_call("Register", {**params, "credential": c}))
        return self._store(urn, cred)

    def renew_slice_sa(self, expiration: dt.datetime, urn: str | None = None) -> str:
        """Extend the slice at the SA; returns (and caches) the new slice credential."""
        urn = urn or self.slice_urn()
        when = format_expiration(expiration)
        cred = self.with_slice_credential(lambda c: self.sa_call(
            "RenewSlice", {"credential": c, "expiration": when}), urn)
        return self._store(urn, cred)

    def get_keys(self, version: int = 2) -> list[Any]:
        return self._with_self(lambda c: self.sa_call(
            "GetKeys", {"credential": c, "version": version}))

    def renew(self, expiration: dt.datetime, cm: int | str | None = None) -> str:
        """Extend the slice at the SA when it would end sooner, then the sliver at the CM.

        Returns the CM's answer (the sliver's new expiry). The SA cannot shorten a slice, so
        a slice that already lasts long enough is left as it is.
        """
        from elasticslice.rpc.credential import expires_of
        if expires_of(self.get_slice_credential()) < expiration:
            self.renew_slice_sa(expiration)
        return self.cm(cm).renew_slice(expiration)

    # ------------------------------------------------------------------ CM shortcuts
    def discover_resources(self, available: bool = False, compress: bool = True,
                           rspec_version: str = "3", cm: int | str | None = None) -> str:
        return self.cm(cm).discover_resources(available, compress, rspec_version)

    def create_sliver(self, rspec: str, keys: list[dict[str, Any]] | None = None,
                      cm: int | str | None = None) -> tuple[str, str]:
        return self.cm(cm).create_sliver(rspec, keys)

    def sliver_status(self, cm: int | str | None = None) -> SliverStatus:
        return self.cm(cm).sliver_status()

    def add_nodes(self, nodes: dict[str, dict[str, Any]], cm: int | str | None = None) -> str:
        return self.cm(cm).add_nodes(nodes)

    def delete_nodes(self, client_ids: list[str], cm: int | str | None = None) -> str:
        return self.cm(cm).delete_nodes(client_ids)

    def renew_slice(self, expiration: dt.datetime, cm: int | str | None = None) -> str:
        return self.cm(cm).renew_slice(expiration)

    def delete_slice(self, cm: int | str | None = None, *, cancel: bool = False,
                     blocking: bool = False) -> None:
        """DeleteSlice at a CM (see :meth:`ComponentManager.delete_slice`)."""
        self.cm(cm).delete_slice(cancel=cancel, blocking=blocking)
