"""The C XML-RPC answer reader (elasticslice/rpc/_fastxmlrpc.c) says what the Python one and
``xmlrpc.client.loads`` say: wherever it gives a value, the standard library gives the same
one (the same types, the same order of a struct's members); wherever it has a doubt it says
UNUSUAL, and ``loads_result`` then gives the Python reader's value or raises the standard
library's error, as without it."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import xmlrpc.client
from typing import Any

import pytest

from elasticslice.rpc import fastxmlrpc
from elasticslice.rpc.fastxmlrpc import loads_result
from tests.helpers import REPO, wait_for
from troy.native import compiler

from .helpers import genilib_request, hours
from .test_fastxmlrpc import BODY, ODD, random_value, response
from .test_fastxmlrpc import \
    test_bad_or_unusual_documents_fail_or_read_as_the_standard_library_says as _bad

#: test_fastxmlrpc.py's bad or unusual documents (its parametrized test's)
BAD = next(m.args[1] for m in _bad.pytestmark if m.name == "parametrize")


def c_reader() -> Any:
    """The C reader's ``loads`` (the test is skipped where it is not built)."""
    why = fastxmlrpc.problem()
    if why is not None:
        pytest.skip(f"the C reader is not in use: {why}")
    from elasticslice.rpc import _fastxmlrpc  # type: ignore[attr-defined]
    return _fastxmlrpc.loads


def typed(v: Any) -> Any:
    """``v`` with every type spelled out (True is not 1, 1.0 is not 1) and dicts' order."""
    if isinstance(v, dict):
        return ("dict", [(typed(k), typed(x)) for k, x in v.items()])
    if isinstance(v, list):
        return ("list", [typed(x) for x in v])
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else repr(v))
    return (type(v).__name__, v)


def stdlib(data: bytes) -> Any:
    (result,), _ = xmlrpc.client.loads(data, use_builtin_types=True)
    return result


def outcome(fn: Any, data: bytes) -> tuple[Any, ...]:
    try:
        return ("value", typed(fn(data)))
    except Exception as e:  # noqa: BLE001
        return ("error", type(e), str(e))


def plain_reader() -> Any:
    """The C reader's plain reader alone (no libxml2: ``loads`` tries it first)."""
    c_reader()
    from elasticslice.rpc import _fastxmlrpc  # type: ignore[attr-defined]
    return _fastxmlrpc.plain


def agree(data: bytes) -> Any:
    """The C reader's answer and its plain reader's (each UNUSUAL or a value the standard
    library gives too; the plain reader reads nothing the C reader hands over), and
    ``loads_result``'s outcome is the standard library's. Returns the C reader's answer."""
    loads = c_reader()
    theirs = outcome(stdlib, data)
    got = loads(data)
    if got is not fastxmlrpc._C_UNUSUAL:
        assert theirs == ("value", typed(got)), data[:300]
    plain = plain_reader()(data)
    if plain is not fastxmlrpc._C_UNUSUAL:
        assert theirs == ("value", typed(plain)), data[:300]
        assert got is not fastxmlrpc._C_UNUSUAL, data[:300]
    assert outcome(loads_result, data) == theirs, data[:300]
    return got


def read_plainly(data: bytes) -> Any:
    """``data`` is read by the plain reader, the same as the standard library."""
    agree(data)
    got = plain_reader()(data)
    assert got is not fastxmlrpc._C_UNUSUAL, data[:300]
    return got


def read_in_c(data: bytes) -> Any:
    """``data`` is read by the C reader (not handed over), the same as the standard library."""
    got = agree(data)
    assert got is not fastxmlrpc._C_UNUSUAL, data[:300]
    return got


def test_make_builds_the_reader_and_loads_result_uses_it() -> None:
    """A set-up with a C compiler has the reader loaded (make runs fastxmlbuild): a build
    that broke would otherwise only show as slower cycles."""
    if compiler() is None:
        pytest.skip("no C compiler here: XML-RPC answers are read in Python")
    assert fastxmlrpc.problem() is None
    assert fastxmlrpc._c_loads is not None
    done = subprocess.run([sys.executable, "-m", "elasticslice.rpc.fastxmlbuild", "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("param", ODD)
def test_the_python_readers_odd_answers(param: str) -> None:
    agree(BODY.format(param).encode())


@pytest.mark.parametrize("doc", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_the_python_readers_bad_documents(doc: str) -> None:
    assert agree(doc.encode()) is fastxmlrpc._C_UNUSUAL


def test_random_values_read_the_same_and_in_c() -> None:
    rng = random.Random(7)
    handed_over = 0
    for _ in range(400):
        value = random_value(rng)
        got = agree(response(value))
        handed_over += got is fastxmlrpc._C_UNUSUAL
    # (datetimes are left to Python: dateTime.iso8601; bytes are read in C)
    assert 0 < handed_over < 250


def plain_value(rng: random.Random, depth: int = 0) -> Any:
    """A value of the kinds the C reader reads (no bytes, no dates; no \r either, which
    dumps() leaves as it is and XML reads as \n)."""
    kinds = ["str", "int", "bool", "float", "none"] + (["list", "dict"] * 3 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice("ab <>&'\"\n\t]é€😀\x7f\x85")
                       for _ in range(rng.randint(0, 8)))
    if kind == "int":
        return rng.choice([rng.randint(-2**31, 2**31 - 1), rng.randint(-9, 9), 0])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), 0.0, -0.0, 1e300, 5e-324, math.inf])
    if kind == "none":
        return None
    if kind == "list":
        return [plain_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["k", "key", "é", "", "a b"]) + str(i): plain_value(rng, depth + 1)
            for i in range(rng.randint(0, 4))}


@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed{s}")
def test_plain_random_values_are_read_in_c(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(100):
        value = plain_value(rng)
        assert read_in_c(response(value)) == value


def sliver_status(nodes: int, seed: int = 3) -> bytes:
    """A SliverStatus answer as the emulator gives it (geni's code/value/output around it)."""
    rng = random.Random(seed)
    details = {}
    for i in range(nodes):
        status = rng.choice(["ready", "ready", "ready", "notready", "changing", "failed"])
        detail = {"component_urn": f"urn:publicid:IDN+emulab.example+node+pc{i}",
                  "client_id": f"node-{i}", "state": "started", "status": status,
                  "rawstate": {"ready": "ISUP"}.get(status, "BOOTING"),
                  "error": "boot timed out" if status == "failed" else ""}
        if rng.random() < 0.5:
            detail.update(execute_state="exited", execute_status=rng.choice([0, 1, 255]))
        details[f"urn:publicid:IDN+emulab.example+sliver+{1000 + i}"] = detail
    value = {"state": "started", "status": "mixed", "utc": 1790000000, "error": "",
             "details": details}
    return response({"code": 0, "value": value, "output": ""})


@pytest.mark.parametrize("nodes", [0, 1, 50, 1000])
def test_sliver_status_answers_are_read_in_c(nodes: int) -> None:
    data = sliver_status(nodes)
    got = read_in_c(data)
    assert len(got["value"]["details"]) == nodes
    assert fastxmlrpc._fast(data) == got
    assert read_plainly(data) == got   # the manager's every cycle: no parser at all


PLAIN = {   # what the plain reader reads itself (the rest it hands to libxml2)
    "entities": "<value><string>a&lt;b&gt;c&amp;d&quot;e&apos;f</string></value>",
    "untyped": "<value> a b </value>",
    "empty-forms": "<value><struct><member><name/><value/></member><member><name>s</name>"
                   "<value><string/></value></member><member><name>n</name><value><nil/>"
                   "</value></member><member><name>d</name><value><array><data/></array>"
                   "</value></member><member><name>e</name><value><struct/></value></member>"
                   "</struct></value>",
    "spaces-in-tags": "<value ><array ><data\n><value\t><int >7</int ></value></data>"
                      "</array></value >",
    "base64": "<value><base64>aGVs\nbG8=</base64></value>",
    "base64-junk": "<value><base64>aGVs!!bG8=</base64></value>",
    "numbers": "<value><array><data><value><i4>-3</i4></value><value><i8>9007199254740993"
               "</i8></value><value><double>2.5</double></value><value><boolean>1</boolean>"
               "</value><value><int> 12 </int></value></data></array></value>",
}
NOT_PLAIN = {   # each left to libxml2 (which reads some of them) or to Python
    "cr": "<value><string>a\rb</string></value>",
    "charref": "<value><string>&#65;</string></value>",
    "non-ascii": "<value><string>\u00e9</string></value>",
    "comment": "<value><!-- c --><string>a</string></value>",
    "cdata": "<value><string><![CDATA[a]]></string></value>",
    "cdata-end": "<value><string>a]]>b</string></value>",
    "attribute": "<value><string x='1'>a</string></value>",
    "namespace": "<value><x:string xmlns:x='u'>a</x:string></value>",
    "date": "<value><dateTime.iso8601>20260101T00:00:00</dateTime.iso8601></value>",
    "text-before-child": "<value>x<string>a</string></value>",
    "text-after-child": "<value><string>a</string>x</value>",
    "text-in-struct": "<value><struct>x</struct></value>",
    "array-empty-form": "<value><array/></value>",
    "two-children": "<value><string>a</string><string>b</string></value>",
    "mismatched": "<value><string>a</int></value>",
    "bool-2": "<value><boolean>2</boolean></value>",
    "int-empty": "<value><int></int></value>",
    "deep-150": "<value><array><data>" * 150 + "<value>1</value>" +
                "</data></array></value>" * 150,
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_the_plain_reader_reads_the_plain_forms(name: str) -> None:
    read_plainly(BODY.format(PLAIN[name]).encode())


@pytest.mark.parametrize("name", sorted(NOT_PLAIN))
def test_the_plain_reader_hands_over_the_rest(name: str) -> None:
    data = BODY.format(NOT_PLAIN[name]).encode()
    agree(data)
    assert plain_reader()(data) is fastxmlrpc._C_UNUSUAL


@pytest.mark.parametrize("head", ["", "<?xml version='1.0'?>", '<?xml version="1.0" '
                                  'encoding="UTF-8"?>\n', "<?xml version='1.0' encoding='utf-8' ?>"])
def test_the_plain_reader_takes_an_xml_declaration_of_utf8(head: str) -> None:
    body = BODY.format("<value>1</value>")
    body = body[body.index("<methodResponse"):]
    assert read_plainly((head + body).encode()) == "1"


@pytest.mark.parametrize("head", ["<?xml version='1.1'?>", "<?xml encoding='utf-8'?>",
                                  "<?xml version='1.0' encoding='latin-1'?>",
                                  "<?xml version='1.0' standalone='yes'?>",
                                  "<?xml-stylesheet href='a'?>", "<!-- c -->", " <?xml version='1.0'?>"])
def test_the_plain_reader_hands_over_other_heads(head: str) -> None:
    body = BODY.format("<value>1</value>")
    data = (head + body[body.index("<methodResponse"):]).encode()
    agree(data)
    assert plain_reader()(data) is fastxmlrpc._C_UNUSUAL


def test_a_real_emulators_answers_read_the_same_and_in_c(emu: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer of a slice's life at the emulator (GetVersion, Resolve, CreateSliver,
    SliverStatus, ListResources with and without compression, DeleteSlice), as the client
    received them: all read in C, the compressed advertisement (base64) too, and all but
    the credentials (XML in text: their character references) by the plain reader."""
    from elasticslice.rpc import transport
    answers: list[bytes] = []

    def recording(data: bytes) -> Any:
        answers.append(bytes(data))
        return loads_result(data)

    monkeypatch.setattr(transport, "loads_result", recording)
    with emu.client() as server:
        server.get_version()
        server.register_slice(expiration=hours(4))
        server.resolve_slice()
        server.create_sliver(genilib_request(*(f"node{i}" for i in range(8))))
        wait_for(lambda: server.sliver_status().ready, timeout=20, what="eight nodes ready")
        server.discover_resources(available=True)   # compressed: base64
        server.discover_resources(available=False, compress=False)
        server.delete_slice()
    assert len(answers) >= 8
    for data in answers:
        read_in_c(data)
        if b"&#" not in data:
            read_plainly(data)
    big = max(answers, key=len)
    assert b"&lt;rspec" in big   # the advertisement, escaped in a string


EDGES = {
    # numbers as Python's int() and float() read them
    "int-spaces": "<value><int> \t\n 42\r\n </int></value>",
    "int-plus": "<value><int>+5</int></value>",
    "int-minus-zero": "<value><int>-0</int></value>",
    "int-leading-zeros": "<value><i4>000123</i4></value>",
    "int-18-digits": "<value><i8>-999999999999999999</i8></value>",
    "int-19-digits": "<value><i8>9223372036854775807</i8></value>",
    "int-25-digits": "<value><int>-1234567890123456789012345</int></value>",
    "int-4300-digits": "<value><int>" + "7" * 4300 + "</int></value>",
    "int-4301-digits": "<value><int>" + "7" * 4301 + "</int></value>",
    "int-underscore": "<value><int>1_000</int></value>",
    "int-double-underscore": "<value><int>1__000</int></value>",
    "int-arabic-indic": "<value><int>\u0663\u0664</int></value>",
    "int-nbsp": "<value><int>\u00a05</int></value>",
    "int-charref-space": "<value><int>&#32;5&#10;</int></value>",
    "int-float": "<value><int>1.0</int></value>",
    "int-hex": "<value><int>0x10</int></value>",
    "int-minus-only": "<value><int>-</int></value>",
    "int-empty": "<value><int/></value>",
    "int-cdata": "<value><int><![CDATA[12]]></int></value>",
    "int-comment": "<value><int>1<!-- x -->2</int></value>",
    "double-plain": "<value><double>3.25</double></value>",
    "double-spaces": "<value><double> -1e-3 </double></value>",
    "double-inf": "<value><double>-inf</double></value>",
    "double-nan": "<value><double>nan</double></value>",
    "double-huge": "<value><double>1e400</double></value>",
    "double-underscore": "<value><double>1_0.5</double></value>",
    "double-int": "<value><double>7</double></value>",
    "double-junk": "<value><double>1.5x</double></value>",
    "double-empty": "<value><double></double></value>",
    "bool-0": "<value><boolean>0</boolean></value>",
    "bool-1": "<value><boolean>1</boolean></value>",
    "bool-space": "<value><boolean> 1</boolean></value>",
    "bool-true": "<value><boolean>true</boolean></value>",
    "bool-01": "<value><boolean>01</boolean></value>",
    "bool-empty": "<value><boolean/></value>",
    "nil-text": "<value><nil>x</nil></value>",
    "nil-child": "<value><nil><int>1</int></nil></value>",
    # text
    "unicode": "<value><string>h\u00e9\u20ac\U0001f600 \u0085\u2028</string></value>",
    "entities": "<value><string>&lt;&gt;&amp;&apos;&quot;&#65;&#x42;&#x1F600;</string></value>",
    "cdata": "<value><string>a<![CDATA[<b>&amp;]]>c</string></value>",
    "cdata-bare": "<value><![CDATA[x]]></value>",
    "crlf": "<value><string>a\r\nb\rc&#13;d</string></value>",
    "whitespace-only": "<value><string> \n\t </string></value>",
    "bare-spaces": "<value>\n  \n</value>",
    "c1-control": "<value><string>\u0080\u009f\x7f</string></value>",
    "nonchar": "<value><string>\ufdd0\U0010fffd</string></value>",
    "long-string": "<value><string>" + "x" * 100_000 + "</string></value>",
    "long-name": "<value><struct><member><name>" + "n" * 5000 + "</name><value>1</value>"
                 "</member></struct></value>",
    "text-after-child": "<value><int>1</int>tail</value>",
    "text-in-struct": "<value><struct>junk<member>x<name>a</name>y<value>1</value>z"
                      "</member>w</struct></value>",
    "text-in-array": "<value><array>j<data>k<value>1</value>l</data>m</array></value>",
    # shapes
    "empty-struct": "<value><struct/></value>",
    "empty-array": "<value><array><data/></array></value>",
    "nested": "<value><array><data><value><array><data><value><struct><member><name>a"
              "</name><value><array><data/></array></value></member></struct></value></data>"
              "</array></value></data></array></value>",
    "duplicate-members": "<value><struct><member><name>b</name><value>1</value></member>"
                         "<member><name>a</name><value>2</value></member><member><name>b"
                         "</name><value><int>3</int></value></member></struct></value>",
    "member-three": "<value><struct><member><name>a</name><value>1</value><value>2</value>"
                    "</member></struct></value>",
    "member-no-name": "<value><struct><member><value>1</value></member></struct></value>",
    "name-child": "<value><struct><member><name><b>a</b></name><value>1</value></member>"
                  "</struct></value>",
    "struct-bare-name": "<value><struct><name>a</name><value>1</value></struct></value>",
    "array-two-data": "<value><array><data><value>1</value></data><data><value>2</value>"
                      "</data></array></value>",
    "data-non-value": "<value><array><data><int>1</int></data></array></value>",
    "value-in-value": "<value><value>x</value></value>",
    "i1": "<value><i1>1</i1></value>",
    "float-tag": "<value><float>1.5</float></value>",
    "biginteger": "<value><biginteger>12</biginteger></value>",
    "bigdecimal": "<value><bigdecimal>1.5</bigdecimal></value>",
    "base64": "<value><base64>aGk=</base64></value>",
    "datetime": "<value><dateTime.iso8601>20261126T14:00:00</dateTime.iso8601></value>",
    "upper-case": "<value><String>x</String></value>",
    "attribute": "<value><string lang='en'>x</string></value>",
    "namespace-default": "<value><string xmlns='urn:x'>x</string></value>",
    "namespace-prefix": "<value><ex:string xmlns:ex='urn:x'>x</ex:string></value>",
    "prefix-undeclared": "<value><ex:string>x</ex:string></value>",
    "pi": "<value><string>a<?p x?>b</string></value>",
    "comment": "<value><string>a<!-- c -->b</string></value>",
    "comment-double-hyphen": "<value>a<!-- a -- b -->b</value>",
    "comment-three-hyphens": "<value>a<!-- x --->b</value>",
    "vertical-tab": "<value><string>a\x0bb</string></value>",
    "spaces-in-tags": "<value ><int >5</int\n></value >",
    "bom-charref": "<value><string>&#xFEFF;&#x2028;\u2028</string></value>",
    "undeclared-entity": "<value><string>&nbsp;</string></value>",
    "cdata-end": "<value><string>a]]>b</string></value>",
    "bad-charref": "<value><string>&#1;</string></value>",
    "surrogate-charref": "<value><string>&#xD800;</string></value>",
    "fffe-charref": "<value><string>&#xFFFE;</string></value>",
}

DOCUMENTS = {
    "no-declaration": "<methodResponse><params><param><value>1</value></param></params>"
                      "</methodResponse>",
    "utf8-declared": "<?xml version='1.0' encoding='UTF-8'?>" + BODY.format(
        "<value>\u00e9</value>")[21:],
    "standalone": "<?xml version='1.0' standalone='yes'?>" + BODY.format("<value>1</value>")[21:],
    "version-1.1": "<?xml version='1.1'?>" + BODY.format("<value>1</value>")[21:],
    "version-2.0": "<?xml version='2.0'?>" + BODY.format("<value>1</value>")[21:],
    "space-before-declaration": " " + BODY.format("<value>1</value>"),
    "newline-before-root": "\n<methodResponse><params><param><value>1</value></param></params>"
                           "</methodResponse>",
    "comments-outside": "<!-- a -->" + BODY.format("<value>1</value>")[21:] + "<!-- b -->\n",
    "pi-outside": BODY.format("<value>1</value>") + "<?x y?>",
    "junk-after": BODY.format("<value>1</value>") + "x",
    "two-roots": BODY.format("<value>1</value>") + "<a/>",
    "truncated": BODY.format("<value><struct><member><name>a</name><value>1</value>")[:-40],
    "root-attribute": "<methodResponse a='1'><params><param><value>1</value></param>"
                      "</params></methodResponse>",
    "root-namespace": "<methodResponse xmlns='urn:x'><params><param><value>1</value></param>"
                      "</params></methodResponse>",
    "params-two-params": "<methodResponse><params><param><value>1</value></param><param>"
                         "<value>2</value></param></params></methodResponse>",
    "param-two-values": "<methodResponse><params><param><value>1</value><value>2</value>"
                        "</param></params></methodResponse>",
    "param-empty": "<methodResponse><params><param/></params></methodResponse>",
    "response-fault-and-params": "<methodResponse><params><param><value>1</value></param>"
                                 "</params><fault/></methodResponse>",
    "method-name": "<methodResponse><methodName>x</methodName><params><param><value>1"
                   "</value></param></params></methodResponse>",
    "fault": "<methodResponse><fault><value><struct><member><name>faultCode</name><value>"
             "<int>3</int></value></member><member><name>faultString</name><value>no</value>"
             "</member></struct></value></fault></methodResponse>",
    "billion-laughs": "<?xml version='1.0'?><!DOCTYPE lolz [<!ENTITY lol 'lol'>"
                      + "".join(f"<!ENTITY lol{i} '{('&lol' + str(i - 1) + ';') * 10}'>"
                                if i else "<!ENTITY lol0 '&lol;&lol;'>" for i in range(9))
                      + "]><methodResponse><params><param><value>&lol8;</value></param>"
                        "</params></methodResponse>",
    "doctype-plain": "<!DOCTYPE methodResponse><methodResponse><params><param><value>1"
                     "</value></param></params></methodResponse>",
    "external-entity": "<!DOCTYPE m [<!ENTITY e SYSTEM 'file:///etc/hostname'>]>"
                       "<methodResponse><params><param><value>&e;</value></param></params>"
                       "</methodResponse>",
    "deep": BODY.format("<value><array><data>" * 300 + "<value>1</value>"
                        + "</data></array></value>" * 300),
    "deep-200": BODY.format("<value><array><data>" * 60 + "<value>1</value>"
                            + "</data></array></value>" * 60),
}

BYTES = {
    "latin1-declared": b"<?xml version='1.0' encoding='ISO-8859-1'?><methodResponse><params>"
                       b"<param><value>\xe9</value></param></params></methodResponse>",
    "utf8-bom": b"\xef\xbb\xbf" + BODY.format("<value>\u00e9</value>").encode(),
    "utf16": BODY.format("<value>\u00e9</value>").replace("'1.0'", "'1.0' encoding='utf-16'")
             .encode("utf-16"),
    "invalid-utf8": BODY.format("<value>X</value>").encode().replace(b"X", b"\xc3("),
    "overlong-utf8": BODY.format("<value>X</value>").encode().replace(b"X", b"\xc0\xaf"),
    "surrogate-utf8": BODY.format("<value>X</value>").encode().replace(b"X", b"\xed\xa0\x80"),
    "fffe-utf8": BODY.format("<value>X</value>").encode().replace(b"X", b"\xef\xbf\xbe"),
    "nul": BODY.format("<value>X</value>").encode().replace(b"X", b"\x00"),
    "control": BODY.format("<value>X</value>").encode().replace(b"X", b"\x01"),
    "empty": b"",
    "one-byte": b"<",
}

READ_IN_C = {"base64", "int-spaces", "int-plus", "int-minus-zero", "int-leading-zeros", "int-18-digits",
             "int-19-digits", "int-25-digits", "int-4300-digits", "int-underscore",
             "int-arabic-indic", "int-nbsp", "int-charref-space", "int-cdata", "int-comment",
             "double-plain", "double-spaces", "double-int", "double-underscore", "double-inf",
             "double-nan", "double-huge", "bool-0", "bool-1",
             "nil-text", "unicode", "entities", "cdata", "cdata-bare", "crlf", "c1-control",
             "nonchar", "long-string", "long-name", "text-after-child", "text-in-struct",
             "text-in-array", "empty-struct", "empty-array", "nested", "duplicate-members",
             "comment", "spaces-in-tags", "bom-charref", "no-declaration", "utf8-declared",
             "standalone", "comments-outside",
             "deep-200", "whitespace-only", "bare-spaces"}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_values(name: str) -> None:
    data = BODY.format(EDGES[name]).encode()
    got = agree(data)
    assert (got is not fastxmlrpc._C_UNUSUAL) == (name in READ_IN_C)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_edge_documents(name: str) -> None:
    got = agree(DOCUMENTS[name].encode())
    assert (got is not fastxmlrpc._C_UNUSUAL) == (name in READ_IN_C)


@pytest.mark.parametrize("name", sorted(BYTES))
def test_edge_bytes(name: str) -> None:
    assert agree(BYTES[name]) is fastxmlrpc._C_UNUSUAL


def test_what_is_not_bytes_is_handed_over() -> None:
    loads = c_reader()
    doc = BODY.format("<value>1</value>")
    assert loads(doc) is fastxmlrpc._C_UNUSUAL
    assert loads(bytearray(doc.encode())) is fastxmlrpc._C_UNUSUAL
    assert loads_result(doc) == "1" == stdlib(doc)   # type: ignore[arg-type]


def test_every_truncation_of_an_answer() -> None:
    data = response({"a": [1, 2.5, True, None, "x&y"], "b": {"c": "é"}})
    for end in range(len(data)):
        agree(data[:end])


def mutations(count: int, seed: int) -> list[bytes]:
    """Valid answers with a few bytes changed, cut, doubled or swapped for XML's own, or
    with something put right after a tag (where text goes: a number's spaces, a comment)."""
    rng = random.Random(seed)
    bases = [response(plain_value(rng)) for _ in range(20)] + [sliver_status(3)]
    specials = [b"<", b">", b"&", b"/", b"\x00", b"\xff", b"\xc3", b"]]>", b"<!--", b"&#",
                b"<![CDATA[", b" ", b"1", b"-", b"_", b"\r", b"<value>", b"</value>",
                b"<int>", b"</data>", b"xmlns='x'", b"<?x?>", b"<!DOCTYPE a>", b"&amp;"]
    after_tag = [b" ", b"\n", b"\t", b"<!--c-->", b"&#48;", b"&amp;", b"<![CDATA[7]]>", b"0",
                 b"-", b"_", b"+", b"\xc2\xa0", b"x", b"1e", b".", b"&#x661;"]
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            at = rng.randrange(len(data))
            how = rng.randrange(8)
            if how == 0:
                data[at] = rng.randrange(256)
            elif how == 1:
                del data[at:at + rng.randint(1, 8)]
            elif how == 2:
                data[at:at] = rng.choice(specials)
            elif how == 3:
                data[at:at] = data[at:at + rng.randint(1, 20)]
            elif how == 4:
                data[at] = rng.choice(b"0123456789 <>/&;abcdefghilmnorstuv")
            else:
                at = data.find(b">", at)
                data[at + 1:at + 1] = rng.choice(after_tag)
        out.append(bytes(data))
    return out


@pytest.mark.parametrize("seed", range(5), ids=lambda s: f"seed{s}")
def test_random_mutations_of_answers(seed: int) -> None:
    read = 0
    for data in mutations(100, seed):
        read += agree(data) is not fastxmlrpc._C_UNUSUAL
    assert 10 < read < 90   # (most after-tag insertions leave a readable answer)


def test_the_variable_turns_the_c_reader_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastxmlrpc, "_problem", None)
    monkeypatch.setattr(fastxmlrpc, "_c_loads", None)
    monkeypatch.setenv("ELASTICSLICE_XMLRPC_READER", "python")
    assert fastxmlrpc.problem() == "turned off (ELASTICSLICE_XMLRPC_READER=python)"
    data = sliver_status(20)
    assert loads_result(data) == stdlib(data)
    assert fastxmlrpc._c_loads is None


def test_the_c_reader_is_loaded_with_lxml_or_for_a_long_answer() -> None:
    """A short command reading a short answer does not import lxml for it (getversion:
    tests/test_cli_imports.py); a long answer, or one after lxml is loaded, is read in C."""
    if compiler() is None:
        pytest.skip("no C compiler here")
    probe = ("import sys; from elasticslice.rpc import fastxmlrpc as f; "
             "f.loads_result(sys.stdin.buffer.read()); "
             "print('lxml.etree' in sys.modules, f._c_loads is not None)")
    env = {k: v for k, v in os.environ.items() if k != "ELASTICSLICE_XMLRPC_READER"}
    for data, expected in ((sliver_status(2), "False False"), (sliver_status(1000), "True True")):
        done = subprocess.run([sys.executable, "-c", probe], input=data, capture_output=True,
                              cwd=REPO, env=env, timeout=120)
        assert done.stdout.decode().strip() == expected, done.stderr


def test_many_reads_of_a_big_answer_keep_memory_flat() -> None:
    """No reference or buffer left behind: 300 reads of a 1,000-node answer."""
    loads = c_reader()
    import resource
    data = sliver_status(1000)
    for _ in range(30):
        loads(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(300):
        loads(data)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 20 * 1024
