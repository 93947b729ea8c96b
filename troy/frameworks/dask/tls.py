"""Mutual TLS for the ``dask`` framework: a cluster only its members can join.

``DaskTLS`` names three PEM files: the cluster's CA certificate, and a member's certificate
and key (signed by that CA). With it, the scheduler listens on ``tls://`` only, and it, the
client and every worker require a peer certificate from the same CA (Dask checks the chain,
not host names): a worker without one, or with one from another CA, cannot join, and nothing
listens unauthenticated. Troy does not make certificates: whoever runs the cluster does
(``elasticslice.pilots`` issues them from the manager's own CA).

Processes we start (scheduler, workers, node agents) get the same files through Dask's
configuration variables (``DASK_DISTRIBUTED__COMM__TLS__...``), which ``Security()`` reads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from troy.errors import BadParameter

# Dask's configuration keys, as environment variables (``Security()`` reads them)
_ENV = "DASK_DISTRIBUTED__COMM__"


@dataclass(frozen=True)
class DaskTLS:
    """A cluster member's TLS files: ``ca_file`` (the cluster CA), ``cert_file`` and
    ``key_file`` (the member's certificate and unencrypted key; the key may also be
    appended to the certificate, then ``key_file`` may name the same file); ``deny_file``
    (optional, a scheduler's): the deny list of certificates refused before their expiry
    (:mod:`troy.frameworks.dask.denylist`)."""

    ca_file: str
    cert_file: str
    key_file: str
    deny_file: str | None = None

    @classmethod
    def coerce(cls, value: DaskTLS | dict[str, Any] | None, where: str) -> DaskTLS | None:
        """``value`` as a ``DaskTLS`` (a dict with the same keys works), files checked."""
        if value is None or isinstance(value, DaskTLS):
            tls = value
        elif isinstance(value, dict):
            unknown = set(value) - {"ca_file", "cert_file", "key_file", "deny_file"}
            if unknown or not {"ca_file", "cert_file", "key_file"} <= set(value):
                raise BadParameter(f"{where}: tls: expected ca_file, cert_file and key_file "
                                   f"(and deny_file), got {sorted(value)}")
            tls = cls(**{k: os.fspath(v) for k, v in value.items()})
        else:
            raise BadParameter(f"{where}: tls: expected DaskTLS or a dict of ca_file, "
                               f"cert_file, key_file; got {type(value).__name__}")
        if tls is not None:
            tls.check(where)
        return tls

    def check(self, where: str) -> None:
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise BadParameter(f"{where}: tls {name}: {path}: not a readable file")

    def security(self) -> Any:
        """The ``distributed.Security`` of a member: every role uses the same certificate."""
        from distributed import Security
        return Security(require_encryption=True, tls_ca_file=self.ca_file,
                        tls_client_cert=self.cert_file, tls_client_key=self.key_file,
                        tls_scheduler_cert=self.cert_file, tls_scheduler_key=self.key_file,
                        tls_worker_cert=self.cert_file, tls_worker_key=self.key_file)

    def environ(self) -> dict[str, str]:
        """Dask configuration variables that give a process we start the same security."""
        env = {f"{_ENV}REQUIRE_ENCRYPTION": "True", f"{_ENV}TLS__CA_FILE": self.ca_file}
        for role in ("CLIENT", "SCHEDULER", "WORKER"):
            env[f"{_ENV}TLS__{role}__CERT"] = self.cert_file
            env[f"{_ENV}TLS__{role}__KEY"] = self.key_file
        if self.deny_file:
            from troy.frameworks.dask.denylist import ENV_VAR
            env[ENV_VAR] = self.deny_file
        return env


def security_from_config() -> Any:
    """In a process we started: the ``Security`` its environment configures (None: plain
    TCP, nothing configured)."""
    from distributed import Security
    sec = Security()
    return sec if sec.require_encryption else None


def hide_security_environ(environ: dict[str, str] | None = None) -> list[str]:
    """Remove Dask's security variables (``DASK_DISTRIBUTED__COMM__TLS__*``,
    ``..._REQUIRE_ENCRYPTION``) from this process's environment, once Dask has read them
    (its configuration keeps them): the processes a worker starts (units) inherit no path to
    the member's key. Returns the names removed."""
    env = os.environ if environ is None else environ
    gone = [k for k in env if k.upper().startswith(f"{_ENV}TLS")
            or k.upper() == f"{_ENV}REQUIRE_ENCRYPTION"]
    for k in gone:
        del env[k]
    return gone
