"""Signed ProtoGENI/GENI credentials: build, sign, delegate, parse and verify.

The format (PROTOCOL.md "Credentials")::

    <signed-credential>
      <credential xml:id="ref0">
        <type>privilege</type> <serial/> <owner_gid/> <owner_urn/> <target_gid/>
        <target_urn/> <uuid/> <expires>YYYY-MM-DDTHH:MM:SSZ</expires>
        <privileges><privilege><name>*</name><can_delegate>1</can_delegate></privilege></privileges>
        [<parent><credential xml:id="ref1">...the delegated credential...</credential></parent>]
      </credential>
      <signatures><Signature xmlns="http://www.w3.org/2000/09/xmldsig#">...</Signature>
                  [the parent's Signature, and its parent's...]</signatures>
    </signed-credential>

Who may sign what (PROTOCOL.md "Credentials: who may sign what"): a credential is valid when
its signature verifies, it has not expired, its signer is the authority of its target (the SA
signs slice and user credentials, the CM sliver credentials) and ``target_gid`` is the
target's own certificate; or when it is a delegation: it embeds its parent, the parent is
valid, the signer is the parent's owner, the delegated privileges had ``can_delegate``, and
the child's privileges and expiry lie within the parent's. A user certificate from the same CA
is not an authority. The signatures themselves are in :mod:`elasticslice.rpc.xmldsig`.

Clients treat credentials as opaque strings; they use :func:`expires_of` for caching and
:func:`delegate` to hand a credential of theirs to another user. Servers (the emulator) use
:func:`sign_credential` and :func:`verify_credential`.
"""
from __future__ import annotations

import copy
import datetime as dt
import re
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cryptography import x509
from lxml import etree

from elasticslice.errors import CredentialError
from elasticslice.isotime import parse_iso
from elasticslice.rpc import pki, xmldsig
from elasticslice.rpc.xmldsig import DS_NS, XML_ID

XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
MAX_CREDENTIAL_BYTES = 1 << 20
MAX_DELEGATION_DEPTH = 8
EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# Which authority of the target's domain signs credentials for each kind of target.
AUTHORITY_ROLES = {"slice": "sa", "user": "sa", "sliver": "cm"}
_URN = re.compile(r"^urn:publicid:IDN\+([^+]+)\+([a-z]+)\+(.+)$")

# target URN -> the certificates allowed to sign credentials for it (its authority)
AuthorityLookup = Callable[[str], Sequence[x509.Certificate]]
# target URN -> the target's own certificate (PEM), or None when the verifier has no record
GidLookup = Callable[[str], "str | None"]


@dataclass
class Credential:
    """The content of a credential; ``expires`` is an aware UTC datetime.

    ``owner_gid``/``target_gid`` are PEM certificates (the GIDs). ``privileges`` are
    ``(name, can_delegate)`` pairs; an empty list means every privilege (``*``).
    ``parent`` is the credential this one was delegated from, if any.
    """

    owner_gid: str
    owner_urn: str
    target_gid: str
    target_urn: str
    expires: dt.datetime
    type: str = "privilege"
    serial: str = "1"
    uuid: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    privileges: list[tuple[str, bool]] = field(default_factory=lambda: [("*", True)])
    parent: Credential | None = None

    def expired(self, now: dt.datetime | None = None) -> bool:
        return (now or dt.datetime.now(dt.timezone.utc)) >= self.expires

    def allows(self, privilege: str) -> bool:
        names = {name for name, _ in self.privileges}
        return not names or "*" in names or privilege in names

    @property
    def delegated(self) -> bool:
        return self.parent is not None


def format_expires(when: dt.datetime) -> str:
    if when.tzinfo is None:
        raise CredentialError("credential expiry must be timezone-aware")
    return when.astimezone(dt.timezone.utc).strftime(EXPIRES_FORMAT)


def parse_expires(text: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SSZ`` (also fractions and ``+00:00``) → aware UTC datetime."""
    raw = (text or "").strip()
    try:
        when = parse_iso(raw)
        if when.tzinfo is None:  # the servers write UTC
            when = when.replace(tzinfo=dt.timezone.utc)
        return when.astimezone(dt.timezone.utc)
    except (ValueError, OverflowError) as err:
        raise CredentialError(f"bad credential expiry {raw!r}") from err


def authority_urn_for(target_urn: str) -> str | None:
    """The URN of the authority that signs credentials for ``target_urn`` (None: nobody).

    ``urn:publicid:IDN+emulab.net:proj+slice+s`` → ``urn:publicid:IDN+emulab.net+authority+sa``.
    """
    m = _URN.match(target_urn or "")
    role = AUTHORITY_ROLES.get(m.group(2)) if m else None
    if m is None or role is None:
        return None
    return f"urn:publicid:IDN+{m.group(1).split(':', 1)[0]}+authority+{role}"


# ---------------------------------------------------------------- parsing

def parse_xml(xml: str | bytes) -> etree._Element:
    """Parse untrusted credential XML: no DTD, no entities, no network, bounded size."""
    data = xml.encode() if isinstance(xml, str) else xml
    if len(data) > MAX_CREDENTIAL_BYTES:
        raise CredentialError("credential too large")
    try:
        root = etree.fromstring(data, xmldsig.parser())
    except etree.XMLSyntaxError as err:
        raise CredentialError(f"credential is not well-formed XML: {err}") from err
    if root.getroottree().docinfo.doctype:
        raise CredentialError("credential contains a DTD; refused")
    if root.tag != "signed-credential":
        raise CredentialError(f"not a signed credential (root <{root.tag}>)")
    return root


def _text(el: etree._Element, tag: str, *, required: bool = True) -> str:
    child = el.find(tag)
    if child is None or child.text is None:
        if required:
            raise CredentialError(f"credential has no <{tag}>")
        return ""
    return child.text.strip()


def _credential_element(root: etree._Element) -> etree._Element:
    cred = root.find("credential")
    if cred is None:
        raise CredentialError("signed-credential has no <credential>")
    return cred


def _parent_element(cred: etree._Element) -> etree._Element | None:
    parents = cred.findall("parent")
    if not parents:
        return None
    inner = parents[0].findall("credential")
    if len(parents) != 1 or len(inner) != 1:
        raise CredentialError("a delegated credential must embed exactly one parent credential")
    return inner[0]


def parse_credential(xml: str | bytes) -> Credential:
    """The content of a credential (and its parents), WITHOUT checking any signature."""
    return _from_element(_credential_element(parse_xml(xml)))


def _from_element(cred: etree._Element, depth: int = 0) -> Credential:
    if depth > MAX_DELEGATION_DEPTH:
        raise CredentialError(f"delegation chain longer than {MAX_DELEGATION_DEPTH}")
    privileges: list[tuple[str, bool]] = []
    for priv in cred.findall("privileges/privilege"):
        name = _text(priv, "name")
        delegate = _text(priv, "can_delegate", required=False).lower() in ("1", "true")
        privileges.append((name, delegate))
    parent = _parent_element(cred)
    return Credential(
        type=_text(cred, "type", required=False) or "privilege",
        serial=_text(cred, "serial", required=False),
        owner_gid=_text(cred, "owner_gid", required=False),
        owner_urn=_text(cred, "owner_urn"),
        target_gid=_text(cred, "target_gid", required=False),
        target_urn=_text(cred, "target_urn"),
        uuid=_text(cred, "uuid", required=False),
        expires=parse_expires(_text(cred, "expires")),
        privileges=privileges,
        parent=None if parent is None else _from_element(parent, depth + 1),
    )


def expires_of(xml: str | bytes) -> dt.datetime:
    """When a credential expires (aware UTC), for client-side caching."""
    return parse_expires(_text(_credential_element(parse_xml(xml)), "expires"))


# ---------------------------------------------------------------- signing and delegating

def _build_document(cred: Credential, ref: str,
                    parent: etree._Element | None = None) -> etree._Element:
    root = etree.Element("signed-credential", nsmap={"xsi": XSI_NS})
    root.set(f"{{{XSI_NS}}}noNamespaceSchemaLocation",
             "http://www.protogeni.net/resources/credential/credential.xsd")
    el = etree.SubElement(root, "credential")
    el.set(XML_ID, ref)
    for tag in ("type", "serial", "owner_gid", "owner_urn", "target_gid", "target_urn",
                "uuid"):
        xmldsig.sub(el, tag, getattr(cred, tag))
    xmldsig.sub(el, "expires", format_expires(cred.expires))
    privs = xmldsig.sub(el, "privileges")
    for name, can_delegate in cred.privileges:
        p = xmldsig.sub(privs, "privilege")
        xmldsig.sub(p, "name", name)
        xmldsig.sub(p, "can_delegate", "1" if can_delegate else "0")
    if parent is not None:
        xmldsig.sub(el, "parent").append(copy.deepcopy(parent))
    return root


def _sign(cred: Credential, signer_cert_pem: bytes | str, signer_key_pem: bytes | str,
          algorithm: str, key_password: bytes | str | None,
          parent: etree._Element | None = None,
          parent_signatures: Iterable[etree._Element] = ()) -> str:
    if algorithm not in xmldsig.SIGN_ALGORITHMS:
        raise CredentialError(f"unsupported signature algorithm {algorithm!r}")
    signer = pki.load_pem_cert(signer_cert_pem)
    key = pki.load_private_key(signer_key_pem, key_password)
    ref = "ref" + uuidlib.uuid4().hex[:16]
    root = _build_document(cred, ref, parent)
    signatures = etree.SubElement(root, "signatures")
    xmldsig.add_template(signatures, ref, algorithm, signer)
    for sig in parent_signatures:  # the parents' signatures travel with the delegation
        signatures.append(copy.deepcopy(sig))
    # Re-parse so the digests are computed over exactly what the verifier will parse.
    root = etree.fromstring(etree.tostring(root, xml_declaration=True, encoding="UTF-8"),
                            xmldsig.parser())
    xmldsig.fill(root.find(f"signatures/{{{DS_NS}}}Signature"), _credential_element(root), key,
                 algorithm)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8").decode()


def sign_credential(cred: Credential, signer_cert_pem: bytes | str, signer_key_pem: bytes | str,
                    *, algorithm: str = "sha256", key_password: bytes | str | None = None) -> str:
    """The credential as a signed XML document (a string, as sent over XML-RPC)."""
    return _sign(cred, signer_cert_pem, signer_key_pem, algorithm, key_password)


def delegate(xml: str | bytes, to_gid: bytes | str, signer_cert_pem: bytes | str,
             signer_key_pem: bytes | str, *, key_password: bytes | str | None = None,
             privileges: Iterable[str] | None = None, can_delegate: bool = False,
             expires: dt.datetime | None = None, algorithm: str = "sha256") -> str:
    """Delegate credential ``xml`` (yours) to the user whose certificate is ``to_gid``.

    Sign with your own certificate and key (the credential's owner). ``privileges`` default
    to every privilege of the credential that may be delegated; ``expires`` to the
    credential's own expiry, which it cannot exceed; ``can_delegate`` lets the new owner
    delegate further. The new owner presents the result like any credential.
    """
    root = parse_xml(xml)
    parent_el = _credential_element(root)
    parent = _from_element(parent_el)
    signer = pki.load_pem_cert(signer_cert_pem)
    if not parent.owner_gid or pki.load_pem_cert(parent.owner_gid) != signer:
        raise CredentialError("only the owner of a credential can delegate it "
                              "(the signer certificate is not its owner_gid)")
    grantable = {name for name, ok in parent.privileges if ok}
    wanted = sorted(grantable) if privileges is None else list(privileges)
    refused = [name for name in wanted if "*" not in grantable and name not in grantable]
    if not wanted or refused:
        raise CredentialError("cannot delegate " + (", ".join(refused) or "anything") +
                              ": the credential does not allow delegating it (can_delegate)")
    when = (expires or parent.expires).replace(microsecond=0)
    if when.tzinfo is None or when > parent.expires:
        raise CredentialError(f"a delegation must be timezone-aware and expire by "
                              f"{format_expires(parent.expires)}, the credential's own expiry")
    new_owner = pki.load_pem_cert(to_gid)
    owner_urn = pki.urn_from_certificate(new_owner)
    if owner_urn is None:
        raise CredentialError("the delegate's certificate carries no URN")
    child = Credential(owner_gid=pki.cert_pem(new_owner), owner_urn=owner_urn,
                       target_gid=parent.target_gid, target_urn=parent.target_urn,
                       expires=when, privileges=[(name, can_delegate) for name in wanted])
    return sign_delegation(child, xml, signer_cert_pem, signer_key_pem,
                           key_password=key_password, algorithm=algorithm)


def sign_delegation(child: Credential, parent_xml: str | bytes, signer_cert_pem: bytes | str,
                    signer_key_pem: bytes | str, *, key_password: bytes | str | None = None,
                    algorithm: str = "sha256") -> str:
    """``child`` signed with ``parent_xml`` embedded as its parent, checking nothing.

    :func:`delegate` is the safe way; this is the bare format (tests build hostile
    delegations with it, which the verifier must refuse).
    """
    root = parse_xml(parent_xml)
    return _sign(child, signer_cert_pem, signer_key_pem, algorithm, key_password,
                 _credential_element(root), root.findall(f"signatures/{{{DS_NS}}}Signature"))


# ---------------------------------------------------------------- verification

def _same_pem(a: str, b: str) -> bool:
    return "".join(a.split()) == "".join(b.split())


@dataclass(frozen=True)
class _Policy:
    roots: list[x509.Certificate]
    now: dt.datetime
    authorities: AuthorityLookup | None
    target_gid: GidLookup | None


def _signatures(root: etree._Element) -> dict[str, etree._Element]:
    found: dict[str, etree._Element] = {}
    for sig in root.findall(f"signatures/{{{DS_NS}}}Signature"):
        ref = xmldsig.reference_of(sig)
        if ref in found:
            raise CredentialError(f"two signatures reference #{ref}")
        found[ref] = sig
    return found


def _check_gids(cred: Credential, policy: _Policy) -> None:
    """``target_gid`` is the target's own certificate; ``owner_gid`` names the owner."""
    known = policy.target_gid(cred.target_urn) if policy.target_gid else None
    wrong = f"target_gid is not the certificate of {cred.target_urn}"
    if known is not None:
        if not _same_pem(known, cred.target_gid):
            raise CredentialError(wrong)
    else:
        if not cred.target_gid:
            raise CredentialError("credential has no <target_gid>")
        gid = pki.load_pem_cert(cred.target_gid)
        if pki.urn_from_certificate(gid) != cred.target_urn or \
                not pki.chains_to(gid, [], policy.roots, None):
            raise CredentialError(wrong)
    if cred.owner_gid and pki.urn_from_certificate(cred.owner_gid) != cred.owner_urn:
        raise CredentialError(f"owner_gid is not the certificate of {cred.owner_urn}")


def _check_authority(certs: list[x509.Certificate], target_urn: str, policy: _Policy) -> None:
    signer = certs[0]
    if not pki.chains_to(signer, certs[1:], policy.roots, policy.now):
        raise CredentialError("credential signer is not trusted (no chain to a trusted CA)")
    if any(signer == root for root in policy.roots):
        return  # the CA itself, which could issue any authority certificate anyway
    signer_urn = pki.urn_from_certificate(signer) or signer.subject.rfc4514_string()
    if policy.authorities is not None:
        if any(signer == cert for cert in policy.authorities(target_urn)):
            return
    elif signer_urn == authority_urn_for(target_urn):
        return
    raise CredentialError(f"credential signer is not trusted for {target_urn}: {signer_urn} "
                          "is not its authority (and this is not a delegation)")


def _check_delegation(child: Credential, parent: Credential,
                      certs: list[x509.Certificate], policy: _Policy) -> None:
    signer = certs[0]
    if not pki.chains_to(signer, certs[1:], policy.roots, policy.now):
        raise CredentialError("delegation signer is not trusted (no chain to a trusted CA)")
    if not parent.owner_gid or pki.load_pem_cert(parent.owner_gid) != signer:
        raise CredentialError("delegation is not signed by the owner of its parent credential")
    if child.target_urn != parent.target_urn or \
            not _same_pem(child.target_gid, parent.target_gid):
        raise CredentialError("delegation names another target than its parent credential")
    if child.expires > parent.expires:
        raise CredentialError("delegation outlives its parent credential "
                              f"({format_expires(parent.expires)})")
    grantable = {name for name, ok in (parent.privileges or [("*", False)]) if ok}
    for name, _ in child.privileges or [("*", False)]:
        if "*" not in grantable and name not in grantable:
            raise CredentialError(f"delegation grants {name!r}, which its parent credential "
                                  "does not allow delegating (can_delegate)")


def _verify_element(root: etree._Element, cred_el: etree._Element,
                    sigs: dict[str, etree._Element], policy: _Policy, depth: int) -> Credential:
    what = "parent credential" if depth else "credential"
    sig = sigs.get(cred_el.get(XML_ID) or "")
    if sig is None:
        raise CredentialError(f"{what} is not signed")
    signed, certs = xmldsig.check_signature(root, sig)
    if signed is not cred_el:
        raise CredentialError(f"signature does not cover the {what}")
    cred = _from_element(cred_el)
    parent_el = _parent_element(cred_el)
    if parent_el is None:
        _check_authority(certs, cred.target_urn, policy)
    elif depth >= MAX_DELEGATION_DEPTH:
        raise CredentialError(f"delegation chain longer than {MAX_DELEGATION_DEPTH}")
    else:
        cred.parent = _verify_element(root, parent_el, sigs, policy, depth + 1)
        _check_delegation(cred, cred.parent, certs, policy)
    _check_gids(cred, policy)
    if cred.expired(policy.now):
        raise CredentialError(f"{what} expired at {format_expires(cred.expires)}")
    return cred


def verify_credential(xml: str | bytes,
                      trusted_ca_pems: Iterable[bytes | str | x509.Certificate], *,
                      caller_urn: str | None = None, target_urn: str | None = None,
                      now: dt.datetime | None = None,
                      authorities: AuthorityLookup | None = None,
                      target_gid: GidLookup | None = None) -> Credential:
    """Check a credential the way a ProtoGENI server does, and return its content.

    ``authorities(target_urn)`` pins the certificates that may sign for a target; without
    it the signer must carry the URN of the target's authority (:func:`authority_urn_for`).
    ``target_gid(target_urn)`` gives the target's certificate where the verifier keeps one;
    otherwise ``target_gid`` must be a certificate of a trusted CA naming the target.
    Raises CredentialError naming the reason: malformed, not the caller's ("This is not
    your credential"), for another target, bad or altered signature, signer not chaining
    to a trusted CA or not the target's authority, a broken delegation, expired.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    root = parse_xml(xml)
    cred_el = _credential_element(root)
    sigs = _signatures(root)
    if not sigs:
        raise CredentialError("credential is not signed")
    if caller_urn is not None and _text(cred_el, "owner_urn") != caller_urn:
        raise CredentialError("This is not your credential")
    if target_urn is not None and _text(cred_el, "target_urn") != target_urn:
        raise CredentialError(f"credential is for {_text(cred_el, 'target_urn')}, "
                              f"not {target_urn}")
    policy = _Policy(pki.load_trusted(trusted_ca_pems), now, authorities, target_gid)
    return _verify_element(root, cred_el, sigs, policy, 0)
