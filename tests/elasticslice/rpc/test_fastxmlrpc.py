"""The fast XML-RPC answer reader says exactly what ``xmlrpc.client.loads`` says: the same
value for every answer, the same exception for every bad one (it hands those over)."""
from __future__ import annotations

import datetime as dt
import random
import xmlrpc.client

import pytest

from elasticslice.rpc import fastxmlrpc
from elasticslice.rpc.fastxmlrpc import loads_result


def stdlib(data: bytes):
    (result,), _ = xmlrpc.client.loads(data, use_builtin_types=True)
    return result


def outcome(fn, data: bytes):
    try:
        return "value", fn(data)
    except Exception as e:  # noqa: BLE001
        return "error", type(e), str(e)


def response(value) -> bytes:
    return xmlrpc.client.dumps((value,), methodresponse=True, allow_none=True).encode()


def random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "bool", "float", "none", "bytes", "date"] + \
        (["list", "dict"] * 3 if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice("ab <>&'\"\n\r\té€😀") for _ in range(rng.randint(0, 6)))
    if kind == "int":
        return rng.randint(-2**31, 2**31 - 1)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "none":
        return None
    if kind == "bytes":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 5)))
    if kind == "date":
        return dt.datetime(2026, 11, rng.randint(1, 28), rng.randint(0, 23))
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def test_random_answers_read_the_same_as_the_standard_library():
    rng = random.Random(22)
    for _ in range(300):
        data = response(random_value(rng))
        assert loads_result(data) == stdlib(data)


def test_a_sliver_status_answer_takes_the_fast_path_and_reads_the_same():
    details = {f"urn:publicid:IDN+x+sliver+{i}": {
        "client_id": f"node-{i}", "status": "ready", "state": "started", "error": "",
        "execute_state": "exited", "execute_status": "0", "component_urn": f"pc{i}"}
        for i in range(50)}
    value = {"code": 0, "output": "", "value": {"status": "ready", "utc": 7,
                                                 "details": details}}
    data = response(value)
    assert fastxmlrpc._fast(data) == value == loads_result(data)


BODY = "<?xml version='1.0'?><methodResponse><params><param>{}</param></params></methodResponse>"
ODD = [
    "<value>plain text</value>", "<value></value>", "<value>  </value>",
    "<value><string/></value>", "<value> <string>x</string> </value>",
    "<value><i4> 42 </i4></value>", "<value><i8>9007199254740993</i8></value>",
    "<value><int>1_000</int></value>", "<value><int></int></value>",
    "<value><int>x</int></value>", "<value><boolean>2</boolean></value>",
    "<value><boolean>1</boolean></value>", "<value><double>1e3</double></value>",
    "<value><nil/></value>", "<value><ex:nil xmlns:ex='urn:x'/></value>", "<value><ex:nil/></value>",
    "<value><base64>aGk=</base64></value>",
    "<value><dateTime.iso8601>20261126T14:00:00</dateTime.iso8601></value>",
    "<value><struct><member><name>a</name><value>1</value></member>"
    "<member><name>a</name><value><int>2</int></value></member></struct></value>",
    "<value><struct><member><value>1</value><name>a</name></member></struct></value>",
    "<value><struct><member><name>a</name></member></struct></value>",
    "<value><struct><!-- c --><member><name>a<!-- c -->b</name><value>x<?pi y?>y</value>"
    "</member></struct></value>",
    "<value><array><data><value>1</value><value><int>2</int></value></data></array></value>",
    "<value><array><data></data></array></value>", "<value><array></array></value>",
    "<value><foo>1</foo></value>", "<value><string><b>x</b></string></value>",
    "<value><string>a&amp;b&#10;&#x1F600;</string></value>", "<value><string>a\r\nb</string></value>",
    "<value><string><![CDATA[<x>]]></string></value>",
    "<value><string>x</string><string>y</string></value>",
]


@pytest.mark.parametrize("param", ODD)
def test_odd_answers_read_or_fail_as_the_standard_library_says(param):
    data = BODY.format(param).encode()
    assert outcome(loads_result, data) == outcome(stdlib, data)


@pytest.mark.parametrize("doc", [
    "<?xml version='1.0'?><methodResponse><fault><value><struct><member><name>faultCode"
    "</name><value><int>4</int></value></member><member><name>faultString</name><value>"
    "<string>no</string></value></member></struct></value></fault></methodResponse>",
    "<methodResponse><params></params></methodResponse>",
    "<methodResponse><params><param><value>1</value></param><param><value>2</value></param>"
    "</params></methodResponse>",
    "<methodCall><methodName>x</methodName><params><param><value>1</value></param></params>"
    "</methodCall>",
    "<methodResponse><params><param><value>truncated",
    "not xml at all", "",
    "<!DOCTYPE m [<!ENTITY e 'hi'>]><methodResponse><params><param><value>&e;</value>"
    "</param></params></methodResponse>",
])
def test_bad_or_unusual_documents_fail_or_read_as_the_standard_library_says(doc):
    data = doc.encode()
    assert outcome(loads_result, data) == outcome(stdlib, data)


@pytest.mark.parametrize("doc", [BODY.format("<value>1</value>"), "not xml at all"])
def test_the_garbage_collector_is_as_it_was_after_a_read(doc):
    import gc
    assert gc.isenabled()
    outcome(loads_result, doc.encode())
    assert gc.isenabled()
    gc.disable()
    try:
        outcome(loads_result, doc.encode())
        assert not gc.isenabled()
    finally:
        gc.enable()
