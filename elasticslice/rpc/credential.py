"""Signed ProtoGENI/GENI credentials: build, sign (XML-DSig), parse and verify.

The format (PROTOCOL.md "Credentials")::

    <signed-credential>
      <credential xml:id="ref0">
        <type>privilege</type> <serial/> <owner_gid/> <owner_urn/> <target_gid/>
        <target_urn/> <uuid/> <expires>YYYY-MM-DDTHH:MM:SSZ</expires>
        <privileges><privilege><name>*</name><can_delegate>1</can_delegate></privilege></privileges>
      </credential>
      <signatures><Signature xmlns="http://www.w3.org/2000/09/xmldsig#">...</Signature></signatures>
    </signed-credential>

The signature is an enveloped XML-DSig over the ``credential`` element, exclusive C14N,
RSA-SHA256 (RSA-SHA1 accepted when verifying, as the real servers' xmlsec1 uses it), with
the signer's certificate in ``KeyInfo/X509Data``. Done with lxml and cryptography, no xmlsec1.

Clients treat credentials as opaque strings; they only need :func:`expires_of` for caching.
Servers (the emulator) use :func:`sign_credential` and :func:`verify_credential`.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from lxml import etree

from elasticslice.errors import CredentialError
from elasticslice.rpc import pki

DS_NS = "http://www.w3.org/2000/09/xmldsig#"
XML_NS = "http://www.w3.org/XML/1998/namespace"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
EXC_C14N = "http://www.w3.org/2001/10/xml-exc-c14n#"
ENVELOPED = "http://www.w3.org/2000/09/xmldsig#enveloped-signature"

# algorithm URI -> (hashlib name, cryptography hash class)
SIGNATURE_METHODS = {
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256": hashes.SHA256,
    "http://www.w3.org/2000/09/xmldsig#rsa-sha1": hashes.SHA1,
}
DIGEST_METHODS = {
    "http://www.w3.org/2001/04/xmlenc#sha256": "sha256",
    "http://www.w3.org/2000/09/xmldsig#sha1": "sha1",
}
_SIGN_ALGS = {
    "sha256": ("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
               "http://www.w3.org/2001/04/xmlenc#sha256"),
    "sha1": ("http://www.w3.org/2000/09/xmldsig#rsa-sha1",
             "http://www.w3.org/2000/09/xmldsig#sha1"),
}

MAX_CREDENTIAL_BYTES = 1 << 20
EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass
class Credential:
    """The content of a credential; ``expires`` is an aware UTC datetime.

    ``owner_gid``/``target_gid`` are PEM certificates (the GIDs). ``privileges`` are
    ``(name, can_delegate)`` pairs; an empty list means every privilege (``*``).
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

    def expired(self, now: dt.datetime | None = None) -> bool:
        return (now or dt.datetime.now(dt.timezone.utc)) >= self.expires

    def allows(self, privilege: str) -> bool:
        names = {name for name, _ in self.privileges}
        return not names or "*" in names or privilege in names


def format_expires(when: dt.datetime) -> str:
    if when.tzinfo is None:
        raise CredentialError("credential expiry must be timezone-aware")
    return when.astimezone(dt.timezone.utc).strftime(EXPIRES_FORMAT)


def parse_expires(text: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SSZ`` (also fractions and ``+00:00``) → aware UTC datetime."""
    raw = (text or "").strip()
    try:
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as err:
        raise CredentialError(f"bad credential expiry {raw!r}") from err
    if when.tzinfo is None:  # the servers write UTC
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc)


# ---------------------------------------------------------------- safe parsing

def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           dtd_validation=False, huge_tree=False, remove_comments=False)


def parse_xml(xml: str | bytes) -> etree._Element:
    """Parse untrusted credential XML: no DTD, no entities, no network, bounded size."""
    data = xml.encode() if isinstance(xml, str) else xml
    if len(data) > MAX_CREDENTIAL_BYTES:
        raise CredentialError("credential too large")
    try:
        root = etree.fromstring(data, _parser())
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


def parse_credential(xml: str | bytes) -> Credential:
    """The content of a credential, WITHOUT checking its signature."""
    return _from_element(_credential_element(parse_xml(xml)))


def _from_element(cred: etree._Element) -> Credential:
    privileges: list[tuple[str, bool]] = []
    for priv in cred.findall("privileges/privilege"):
        name = _text(priv, "name")
        delegate = _text(priv, "can_delegate", required=False).lower() in ("1", "true")
        privileges.append((name, delegate))
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
    )


def expires_of(xml: str | bytes) -> dt.datetime:
    """When a credential expires (aware UTC), for client-side caching."""
    return parse_expires(_text(_credential_element(parse_xml(xml)), "expires"))


# ---------------------------------------------------------------- signing

def _c14n(el: etree._Element) -> bytes:
    return etree.tostring(el, method="c14n", exclusive=True, with_comments=False)


def _sub(parent: etree._Element, tag: str, text: str | None = None,
         **attrs: str) -> etree._Element:
    child = etree.SubElement(parent, tag, attrs)
    if text is not None:
        child.text = text
    return child


def _build_document(cred: Credential, ref: str) -> etree._Element:
    nsmap = {"xsi": XSI_NS}
    root = etree.Element("signed-credential", nsmap=nsmap)
    root.set(f"{{{XSI_NS}}}noNamespaceSchemaLocation",
             "http://www.protogeni.net/resources/credential/credential.xsd")
    el = etree.SubElement(root, "credential")
    el.set(f"{{{XML_NS}}}id", ref)
    _sub(el, "type", cred.type)
    _sub(el, "serial", cred.serial)
    _sub(el, "owner_gid", cred.owner_gid)
    _sub(el, "owner_urn", cred.owner_urn)
    _sub(el, "target_gid", cred.target_gid)
    _sub(el, "target_urn", cred.target_urn)
    _sub(el, "uuid", cred.uuid)
    _sub(el, "expires", format_expires(cred.expires))
    privs = _sub(el, "privileges")
    for name, delegate in cred.privileges:
        p = _sub(privs, "privilege")
        _sub(p, "name", name)
        _sub(p, "can_delegate", "1" if delegate else "0")
    return root


def _signature_template(root: etree._Element, ref: str, algorithm: str,
                        signer: x509.Certificate) -> etree._Element:
    sig_alg, digest_alg = _SIGN_ALGS[algorithm]
    sigs = etree.SubElement(root, "signatures")
    sig = etree.SubElement(sigs, f"{{{DS_NS}}}Signature", nsmap={None: DS_NS})
    sig.set(f"{{{XML_NS}}}id", f"Sig_{ref}")
    info = _sub(sig, f"{{{DS_NS}}}SignedInfo")
    _sub(info, f"{{{DS_NS}}}CanonicalizationMethod", Algorithm=EXC_C14N)
    _sub(info, f"{{{DS_NS}}}SignatureMethod", Algorithm=sig_alg)
    reference = _sub(info, f"{{{DS_NS}}}Reference", URI=f"#{ref}")
    transforms = _sub(reference, f"{{{DS_NS}}}Transforms")
    _sub(transforms, f"{{{DS_NS}}}Transform", Algorithm=ENVELOPED)
    _sub(transforms, f"{{{DS_NS}}}Transform", Algorithm=EXC_C14N)
    _sub(reference, f"{{{DS_NS}}}DigestMethod", Algorithm=digest_alg)
    _sub(reference, f"{{{DS_NS}}}DigestValue", "")
    _sub(sig, f"{{{DS_NS}}}SignatureValue", "")
    key_info = _sub(sig, f"{{{DS_NS}}}KeyInfo")
    data = _sub(key_info, f"{{{DS_NS}}}X509Data")
    _sub(data, f"{{{DS_NS}}}X509SubjectName", signer.subject.rfc4514_string())
    serial = _sub(data, f"{{{DS_NS}}}X509IssuerSerial")
    _sub(serial, f"{{{DS_NS}}}X509IssuerName", signer.issuer.rfc4514_string())
    _sub(serial, f"{{{DS_NS}}}X509SerialNumber", str(signer.serial_number))
    der = signer.public_bytes(serialization.Encoding.DER)
    _sub(data, f"{{{DS_NS}}}X509Certificate", base64.b64encode(der).decode())
    return sig


def sign_credential(cred: Credential, signer_cert_pem: bytes | str, signer_key_pem: bytes | str,
                    *, algorithm: str = "sha256", key_password: bytes | str | None = None) -> str:
    """The credential as a signed XML document (a string, as sent over XML-RPC)."""
    if algorithm not in _SIGN_ALGS:
        raise CredentialError(f"unsupported signature algorithm {algorithm!r}")
    signer = pki.load_pem_cert(signer_cert_pem)
    key = pki.load_private_key(signer_key_pem, key_password)
    ref = "ref" + uuidlib.uuid4().hex[:16]
    root = _build_document(cred, ref)
    _signature_template(root, ref, algorithm, signer)
    # Re-parse so the digests are computed over exactly what the verifier will parse.
    root = etree.fromstring(etree.tostring(root, xml_declaration=True, encoding="UTF-8"),
                            _parser())
    sig = root.find(f"signatures/{{{DS_NS}}}Signature")
    cred_el = _credential_element(root)
    digest_name = "sha256" if algorithm == "sha256" else "sha1"
    digest = hashlib.new(digest_name, _c14n(cred_el)).digest()
    sig.find(f".//{{{DS_NS}}}DigestValue").text = base64.b64encode(digest).decode()
    info = sig.find(f"{{{DS_NS}}}SignedInfo")
    hash_cls = SIGNATURE_METHODS[_SIGN_ALGS[algorithm][0]]
    value = key.sign(_c14n(info), padding.PKCS1v15(), hash_cls())
    sig.find(f"{{{DS_NS}}}SignatureValue").text = base64.b64encode(value).decode()
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8").decode()


# ---------------------------------------------------------------- verification

def _b64(el: etree._Element | None, what: str) -> bytes:
    if el is None or not (el.text or "").strip():
        raise CredentialError(f"signature has no {what}")
    try:
        return base64.b64decode("".join(el.text.split()), validate=True)
    except ValueError as err:
        raise CredentialError(f"signature {what} is not base64") from err


def _by_xml_id(root: etree._Element, ref: str) -> etree._Element:
    found = [el for el in root.iter() if el.get(f"{{{XML_NS}}}id") == ref]
    if len(found) != 1:
        raise CredentialError(f"signature reference #{ref} matches {len(found)} elements")
    return found[0]


def _check_signature(root: etree._Element, sig: etree._Element) -> tuple[etree._Element,
                                                                          list[x509.Certificate]]:
    """Check one Signature; return the element it signs and the certificates it carries."""
    info = sig.find(f"{{{DS_NS}}}SignedInfo")
    if info is None:
        raise CredentialError("signature has no SignedInfo")
    method = info.find(f"{{{DS_NS}}}SignatureMethod")
    hash_cls = SIGNATURE_METHODS.get(method.get("Algorithm", "") if method is not None else "")
    if hash_cls is None:
        raise CredentialError("unsupported signature method")
    canon = info.find(f"{{{DS_NS}}}CanonicalizationMethod")
    if canon is None or canon.get("Algorithm") != EXC_C14N:
        raise CredentialError("unsupported canonicalization method")
    reference = info.find(f"{{{DS_NS}}}Reference")
    uri = reference.get("URI", "") if reference is not None else ""
    if not uri.startswith("#"):
        raise CredentialError("signature does not reference the credential")
    signed = _by_xml_id(root, uri[1:])
    digest_method = reference.find(f"{{{DS_NS}}}DigestMethod")
    digest_name = DIGEST_METHODS.get(digest_method.get("Algorithm", "")
                                     if digest_method is not None else "")
    if digest_name is None:
        raise CredentialError("unsupported digest method")
    # Enveloped-signature transform: drop any Signature inside the signed element.
    target = etree.fromstring(etree.tostring(signed), _parser())
    for inner in target.findall(f".//{{{DS_NS}}}Signature"):
        inner.getparent().remove(inner)
    expected = _b64(reference.find(f"{{{DS_NS}}}DigestValue"), "DigestValue")
    if hashlib.new(digest_name, _c14n(target)).digest() != expected:
        raise CredentialError("credential signature is invalid: digest mismatch "
                              "(the credential was altered)")
    certs = [pki.load_pem_cert(_b64(el, "X509Certificate"))
             for el in sig.findall(f"{{{DS_NS}}}KeyInfo/{{{DS_NS}}}X509Data/"
                                   f"{{{DS_NS}}}X509Certificate")]
    if not certs:
        raise CredentialError("signature carries no signer certificate")
    signer = certs[0]
    public = signer.public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise CredentialError("signer key is not RSA")
    value = _b64(sig.find(f"{{{DS_NS}}}SignatureValue"), "SignatureValue")
    try:
        public.verify(value, _c14n(info), padding.PKCS1v15(), hash_cls())
    except InvalidSignature as err:
        raise CredentialError("credential signature is invalid (bad signature value)") from err
    return signed, certs


def _chains_to(signer: x509.Certificate, intermediates: list[x509.Certificate],
               trusted: list[x509.Certificate], now: dt.datetime) -> bool:
    """True if ``signer`` is a trusted certificate or chains to one through ``intermediates``."""
    current = signer
    pool = list(intermediates)
    for _ in range(8):
        if not (current.not_valid_before_utc <= now <= current.not_valid_after_utc):
            return False
        if any(current == t for t in trusted):
            return True
        if any(pki.issued_by(current, t) for t in trusted):
            return True
        nxt = next((c for c in pool if c != current and pki.issued_by(current, c)), None)
        if nxt is None:
            return False
        pool.remove(nxt)
        current = nxt
    return False


def _trusted(trusted_ca_pems: Iterable[bytes | str | x509.Certificate]) -> list[x509.Certificate]:
    out: list[x509.Certificate] = []
    for item in trusted_ca_pems:
        if isinstance(item, x509.Certificate):
            out.append(item)
        else:
            out.extend(pki.load_pem_certs(item))
    return out


def verify_credential(xml: str | bytes,
                      trusted_ca_pems: Iterable[bytes | str | x509.Certificate], *,
                      caller_urn: str | None = None, target_urn: str | None = None,
                      now: dt.datetime | None = None) -> Credential:
    """Check a credential the way a ProtoGENI server does, and return its content.

    Raises CredentialError naming the reason: malformed, bad or altered signature, signer
    not chaining to a trusted CA, expired, not the caller's ("This is not your
    credential"), or for another target.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    root = parse_xml(xml)
    cred_el = _credential_element(root)
    sigs = root.findall(f"signatures/{{{DS_NS}}}Signature")
    if not sigs:
        raise CredentialError("credential is not signed")
    signed, certs = _check_signature(root, sigs[0])
    if signed is not cred_el:
        raise CredentialError("signature does not cover the credential")
    if not _chains_to(certs[0], certs[1:], _trusted(trusted_ca_pems), now):
        raise CredentialError("credential signer is not trusted (no chain to a trusted CA)")
    cred = _from_element(cred_el)
    if cred.expired(now):
        raise CredentialError(f"credential expired at {format_expires(cred.expires)}")
    if caller_urn is not None and cred.owner_urn != caller_urn:
        raise CredentialError("This is not your credential")
    if target_urn is not None and cred.target_urn != target_urn:
        raise CredentialError(f"credential is for {cred.target_urn}, not {target_urn}")
    return cred
