"""Enveloped XML-DSig as GENI credentials use it, with lxml and cryptography (no xmlsec1).

Exclusive C14N, RSA-SHA256 when signing (RSA-SHA1 accepted when verifying, as the real
servers' xmlsec1 uses it), the signer's certificate in ``KeyInfo/X509Data``. A signature
references the element it signs by ``xml:id``; :func:`check_signature` returns that element
and the certificates the signature carries, so the caller decides whom to trust.
"""
from __future__ import annotations

import base64
import hashlib

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from lxml import etree

from elasticslice.errors import CredentialError
from elasticslice.rpc import pki

DS_NS = "http://www.w3.org/2000/09/xmldsig#"
XML_NS = "http://www.w3.org/XML/1998/namespace"
XML_ID = f"{{{XML_NS}}}id"
EXC_C14N = "http://www.w3.org/2001/10/xml-exc-c14n#"
ENVELOPED = "http://www.w3.org/2000/09/xmldsig#enveloped-signature"

SIGNATURE_METHODS = {
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256": hashes.SHA256,
    "http://www.w3.org/2000/09/xmldsig#rsa-sha1": hashes.SHA1,
}
DIGEST_METHODS = {
    "http://www.w3.org/2001/04/xmlenc#sha256": "sha256",
    "http://www.w3.org/2000/09/xmldsig#sha1": "sha1",
}
SIGN_ALGORITHMS = {
    "sha256": ("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
               "http://www.w3.org/2001/04/xmlenc#sha256"),
    "sha1": ("http://www.w3.org/2000/09/xmldsig#rsa-sha1",
             "http://www.w3.org/2000/09/xmldsig#sha1"),
}


def parser() -> etree.XMLParser:
    """The one parser for untrusted XML here: no DTD, no entities, no network."""
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           dtd_validation=False, huge_tree=False, remove_comments=False)


def c14n(el: etree._Element) -> bytes:
    return etree.tostring(el, method="c14n", exclusive=True, with_comments=False)


def sub(parent: etree._Element, tag: str, text: str | None = None,
        **attrs: str) -> etree._Element:
    child = etree.SubElement(parent, tag, attrs)
    if text is not None:
        child.text = text
    return child


def add_template(signatures: etree._Element, ref: str, algorithm: str,
                 signer: x509.Certificate) -> etree._Element:
    """An empty Signature over ``#ref`` (filled in by :func:`fill`), appended to ``signatures``."""
    sig_alg, digest_alg = SIGN_ALGORITHMS[algorithm]
    sig = etree.SubElement(signatures, f"{{{DS_NS}}}Signature", nsmap={None: DS_NS})
    sig.set(XML_ID, f"Sig_{ref}")
    info = sub(sig, f"{{{DS_NS}}}SignedInfo")
    sub(info, f"{{{DS_NS}}}CanonicalizationMethod", Algorithm=EXC_C14N)
    sub(info, f"{{{DS_NS}}}SignatureMethod", Algorithm=sig_alg)
    reference = sub(info, f"{{{DS_NS}}}Reference", URI=f"#{ref}")
    transforms = sub(reference, f"{{{DS_NS}}}Transforms")
    sub(transforms, f"{{{DS_NS}}}Transform", Algorithm=ENVELOPED)
    sub(transforms, f"{{{DS_NS}}}Transform", Algorithm=EXC_C14N)
    sub(reference, f"{{{DS_NS}}}DigestMethod", Algorithm=digest_alg)
    sub(reference, f"{{{DS_NS}}}DigestValue", "")
    sub(sig, f"{{{DS_NS}}}SignatureValue", "")
    key_info = sub(sig, f"{{{DS_NS}}}KeyInfo")
    data = sub(key_info, f"{{{DS_NS}}}X509Data")
    sub(data, f"{{{DS_NS}}}X509SubjectName", signer.subject.rfc4514_string())
    serial = sub(data, f"{{{DS_NS}}}X509IssuerSerial")
    sub(serial, f"{{{DS_NS}}}X509IssuerName", signer.issuer.rfc4514_string())
    sub(serial, f"{{{DS_NS}}}X509SerialNumber", str(signer.serial_number))
    der = signer.public_bytes(serialization.Encoding.DER)
    sub(data, f"{{{DS_NS}}}X509Certificate", base64.b64encode(der).decode())
    return sig


def fill(sig: etree._Element, signed: etree._Element, key: rsa.RSAPrivateKey,
         algorithm: str) -> None:
    """Compute the digest of ``signed`` and the signature value of a template."""
    digest = hashlib.new(algorithm, c14n(signed)).digest()
    sig.find(f".//{{{DS_NS}}}DigestValue").text = base64.b64encode(digest).decode()
    info = sig.find(f"{{{DS_NS}}}SignedInfo")
    hash_cls = SIGNATURE_METHODS[SIGN_ALGORITHMS[algorithm][0]]
    value = key.sign(c14n(info), padding.PKCS1v15(), hash_cls())
    sig.find(f"{{{DS_NS}}}SignatureValue").text = base64.b64encode(value).decode()


def reference_of(sig: etree._Element) -> str:
    """The xml:id a Signature references ('' if none)."""
    ref = sig.find(f"{{{DS_NS}}}SignedInfo/{{{DS_NS}}}Reference")
    uri = ref.get("URI", "") if ref is not None else ""
    return uri[1:] if uri.startswith("#") else ""


def _b64(el: etree._Element | None, what: str) -> bytes:
    if el is None or not (el.text or "").strip():
        raise CredentialError(f"signature has no {what}")
    try:
        return base64.b64decode("".join(el.text.split()), validate=True)
    except ValueError as err:
        raise CredentialError(f"signature {what} is not base64") from err


def by_xml_id(root: etree._Element, ref: str) -> etree._Element:
    found = [el for el in root.iter() if el.get(XML_ID) == ref]
    if len(found) != 1:
        raise CredentialError(f"signature reference #{ref} matches {len(found)} elements")
    return found[0]


def check_signature(root: etree._Element, sig: etree._Element
                    ) -> tuple[etree._Element, list[x509.Certificate]]:
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
    ref = reference_of(sig)
    if not ref:
        raise CredentialError("signature does not reference the credential")
    signed = by_xml_id(root, ref)
    digest_method = reference.find(f"{{{DS_NS}}}DigestMethod")
    digest_name = DIGEST_METHODS.get(digest_method.get("Algorithm", "")
                                     if digest_method is not None else "")
    if digest_name is None:
        raise CredentialError("unsupported digest method")
    # Enveloped-signature transform: drop any Signature inside the signed element.
    target = etree.fromstring(etree.tostring(signed), parser())
    for inner in target.findall(f".//{{{DS_NS}}}Signature"):
        inner.getparent().remove(inner)
    expected = _b64(reference.find(f"{{{DS_NS}}}DigestValue"), "DigestValue")
    if hashlib.new(digest_name, c14n(target)).digest() != expected:
        raise CredentialError("credential signature is invalid: digest mismatch "
                              "(the credential was altered)")
    certs = [pki.load_pem_cert(_b64(el, "X509Certificate"))
             for el in sig.findall(f"{{{DS_NS}}}KeyInfo/{{{DS_NS}}}X509Data/"
                                   f"{{{DS_NS}}}X509Certificate")]
    if not certs:
        raise CredentialError("signature carries no signer certificate")
    public = certs[0].public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise CredentialError("signer key is not RSA")
    value = _b64(sig.find(f"{{{DS_NS}}}SignatureValue"), "SignatureValue")
    try:
        public.verify(value, c14n(info), padding.PKCS1v15(), hash_cls())
    except InvalidSignature as err:
        raise CredentialError("credential signature is invalid (bad signature value)") from err
    return signed, certs
