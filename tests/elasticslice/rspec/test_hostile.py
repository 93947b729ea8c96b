"""Hostile and broken XML is refused with one clear message, and nothing is ever read.

The proof that no file is opened: external references point at a FIFO. Opening a FIFO for
reading blocks until a writer appears, so a parser that tried to read it would hang; the
parse runs in a thread that must finish promptly, and the FIFO must still have no reader.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from elasticslice.rspec import DEFAULT_MAX_BYTES, HostileXMLError, RSpecError, parse, validate

V3 = "http://www.geni.net/resources/rspec/3"

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<rspec xmlns="%s" type="request"><node client_id="&lol9;"/></rspec>
""" % V3


def _utf16(text: str) -> bytes:
    """The same document in UTF-16, which hides the DOCTYPE from a byte scan."""
    return text.replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="UTF-16"?>') \
        .encode("utf-16")


def _padded(text: str) -> bytes:
    """A long comment before the DOCTYPE puts it beyond the byte scan of the prolog, so the
    lxml-level defences (parser options, refusing resolver, docinfo check) must hold alone."""
    head, _, rest = text.partition("\n")
    return f"{head}\n<!-- {'x' * 20000} -->\n{rest}".encode()


ENCODINGS = pytest.mark.parametrize("encode", [str, _utf16, _padded],
                                    ids=["utf8", "utf16", "padded"])


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "trap"
    os.mkfifo(path)
    return path


def _assert_never_opened(fifo: Path, action: Callable[[], object]) -> BaseException | None:
    """Run ``action`` in a thread; fail if it blocks (i.e. opened the FIFO for reading)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            action()
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - reported to the test thread
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # release the reader
        os.close(fd)
        thread.join(timeout=5)
        pytest.fail(f"the parser opened {fifo} for reading")
    with pytest.raises(OSError):  # no reader holds the FIFO open either
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    return outcome[0]


@ENCODINGS
def test_billion_laughs_is_refused(encode) -> None:
    with pytest.raises(HostileXMLError, match="(?i)DOCTYPE|entity") as info:
        parse(encode(BILLION_LAUGHS), source="lol.xml")
    assert str(info.value).startswith("lol.xml:")
    assert "lollol" not in str(info.value)


def test_entity_reference_without_declaration_is_refused() -> None:
    with pytest.raises(HostileXMLError, match="(?i)entity"):
        parse(f'<rspec xmlns="{V3}" type="request"><node client_id="&x;"/></rspec>')


@ENCODINGS
def test_external_entity_to_etc_passwd_is_refused(encode) -> None:
    xml = ('<?xml version="1.0"?>\n<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
           f'<rspec xmlns="{V3}" type="request"><node client_id="a">&x;</node></rspec>')
    with pytest.raises(HostileXMLError) as info:
        parse(encode(xml), source="xxe.xml")
    assert "root:" not in str(info.value)


@ENCODINGS
@pytest.mark.parametrize("template", [
    '<!DOCTYPE rspec SYSTEM "{fifo}">\n<rspec xmlns="%s" type="request"/>',
    '<!DOCTYPE r [<!ENTITY x SYSTEM "{fifo}">]>\n<rspec xmlns="%s" type="request">&x;</rspec>',
    '<!DOCTYPE r [<!ENTITY % p SYSTEM "{fifo}"> %p;]>\n<rspec xmlns="%s" type="request"/>',
], ids=["external-dtd", "external-entity", "parameter-entity"])
def test_external_references_are_refused_without_opening_them(fifo, encode, template) -> None:
    xml = '<?xml version="1.0"?>\n' + template.replace("{fifo}", str(fifo)).replace("%s", V3)
    error = _assert_never_opened(fifo, lambda: parse(encode(xml), source="ext.xml"))
    assert isinstance(error, HostileXMLError), error
    assert str(error).startswith("ext.xml:")


def test_xinclude_is_not_processed(fifo) -> None:
    xml = (f'<rspec xmlns="{V3}" xmlns:xi="http://www.w3.org/2001/XInclude" type="request">'
           f'<xi:include href="{fifo}" parse="text"/><node client_id="a"/></rspec>')
    error = _assert_never_opened(fifo, lambda: parse(xml))
    assert error is None


def test_validation_opens_nothing_either(fifo) -> None:
    xml = (f'<rspec xmlns="{V3}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
           f'xsi:schemaLocation="{V3} {fifo}" type="request"><node client_id="a"/></rspec>')
    assert _assert_never_opened(fifo, lambda: validate(xml)) is None


@pytest.mark.parametrize("xml,fragment", [
    (f'<rspec xmlns="{V3}" type="request"><node client_id="a">', "Premature end of data"),
    ("", "empty"),
    ("just text", "not well-formed XML"),
    (b"\x00\xff\xfe garbage", "not well-formed XML"),
])
def test_broken_xml_is_refused_with_its_line(xml, fragment) -> None:
    with pytest.raises(RSpecError, match=fragment) as info:
        parse(xml, source="broken.xml")
    assert not isinstance(info.value, HostileXMLError)
    assert str(info.value).startswith("broken.xml")


def test_truncation_reports_the_line() -> None:
    xml = f'<rspec xmlns="{V3}" type="request">\n<node client_id="a">\n<node client_id="b'
    with pytest.raises(RSpecError) as info:
        parse(xml, source="cut.xml")
    assert info.value.line == 3


def test_oversize_input_is_refused_before_parsing() -> None:
    small = f'<rspec xmlns="{V3}" type="request">' + "<node client_id='a'/>" * 100 + "</rspec>"
    with pytest.raises(HostileXMLError, match="larger than the limit of 1000 bytes"):
        parse(small, source="big.xml", max_bytes=1000)
    huge = b"<a>" + b"x" * DEFAULT_MAX_BYTES + b"</a>"
    with pytest.raises(HostileXMLError, match="larger than the limit"):
        parse(huge)
