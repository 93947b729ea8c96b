"""Client command-line input that used to end in an internal error, a vague message, or a
round trip to the server for what could be refused locally."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli

V3 = 'xmlns="http://www.geni.net/resources/rspec/3"'


@pytest.mark.parametrize("hours", ["nan", "inf", "1e308", "9000", "0", "abc"])
@pytest.mark.parametrize("command", ["renew", "create-slice"])
def test_hours_that_overflowed_or_slipped_through_are_usage_errors(tmp_path, command, hours):
    result = CliRunner().invoke(cli, ["--config", str(tmp_path / "none.conf"), command,
                                      "--hours", hours])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--hours'" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("body, expected", [
    (f'<rspec {V3} type="manifest"><node client_id="a"/></rspec>', "a manifest RSpec, not a request"),
    (f'<rspec {V3} type="request"></rspec>', "the request has no nodes"),
    (f'<rspec {V3} type="request"><node/></rspec>', ":1: invalid request: Element"),
    # broke: sent to the CM, which took a client_id that AddNodes refuses
    (f'<rspec {V3} type="request"><node client_id="../../x"/></rspec>',
     "invalid request: node client_id '../../x': client_id must be 1-64 letters"),
    ('<rspec xmlns="http://www.protogeni.net/resources/rspec/2" type="request">'
     '<node client_id="a/b"/></rspec>', "invalid request: node client_id 'a/b'"),
    (f'<rspec {V3} xmlns:a="urn:x" xmlns:b="urn:x" type="request">'
     '<node client_id="n" a:f="1" b:f="2"/></rspec>',
     ":1: not well-formed XML: Namespaced Attribute f in 'urn:x' redefined"),
])
def test_create_sliver_refuses_a_bad_request_locally(tmp_path, body, expected):
    rspec = tmp_path / "req.xml"
    rspec.write_text(body)
    # No config exists: the RSpec is refused before any server is contacted.
    result = CliRunner().invoke(cli, ["--config", str(tmp_path / "none.conf"),
                                      "create-sliver", str(rspec)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {rspec}") and expected in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("text, expected", [
    ("garbage\n", "not an INI file: line 1 comes before any [section] header"),
    ("[protogeni]\ncertificate = a\ncertificate = b\n", "line 3: key 'certificate' given twice"),
    ("[protogeni]\nfoo\n", "not 'key = value' at line(s) 2"),
])
def test_config_that_is_not_ini_is_one_line(tmp_path, text, expected):
    conf = tmp_path / "c.conf"
    conf.write_text(text)
    result = CliRunner().invoke(cli, ["--config", str(conf), "getversion"])
    assert result.exit_code == 1
    assert f"Error: {conf}: {expected}" in result.output
    assert len(result.output.strip().splitlines()) == 1


def _config_with(tmp_path, emulator_pki, **changes):
    conf = tmp_path / "c.conf"
    text = (emulator_pki / "elasticslice.conf").read_text()
    lines = [ln for ln in text.splitlines() if ln.split("=")[0].strip() not in changes]
    lines += [f"{k} = {v}" for k, v in changes.items()]
    conf.write_text("\n".join(lines) + "\n")
    return conf


def test_wrong_passphrase_says_so(tmp_path, emulator_pki):
    wrong = tmp_path / "pw"
    wrong.write_text("not the password\n")
    conf = _config_with(tmp_path, emulator_pki, passphrase_file=wrong)
    result = CliRunner().invoke(cli, ["--config", str(conf), "getversion"])
    assert result.exit_code == 1
    assert "[certificate]" in result.output and "wrong passphrase" in result.output
    assert "(None)" not in result.output
    assert "not the password" not in result.output


def test_certificate_file_without_a_certificate_says_so(tmp_path, emulator_pki):
    notpem = tmp_path / "notpem"
    notpem.write_text("hello\n")
    conf = _config_with(tmp_path, emulator_pki, certificate=notpem)
    result = CliRunner().invoke(cli, ["--config", str(conf), "getversion"])
    assert result.exit_code == 1 and "no certificate in it" in result.output


def test_key_only_pem_says_no_certificate(tmp_path, emulator_pki):
    key_only = tmp_path / "key.pem"
    shutil.copy(emulator_pki / "ca-key.pem", key_only)
    conf = _config_with(tmp_path, emulator_pki, certificate=key_only)
    result = CliRunner().invoke(cli, ["--config", str(conf), "getversion"])
    assert result.exit_code == 1 and "no certificate in it" in result.output


def test_bad_value_from_the_environment_names_the_variable(tmp_path, emulator_pki):
    from elasticslice.config import load_config
    from elasticslice.errors import ConfigError

    conf = _config_with(tmp_path, emulator_pki)
    with pytest.raises(ConfigError) as err:
        load_config(conf, env={"ELASTICSLICE_TIMEOUT": "abc"})
    assert str(err.value) == f"{conf}: [timeout] not a number: 'abc' (from $ELASTICSLICE_TIMEOUT)"
    with pytest.raises(ConfigError) as err:
        load_config(conf, env={"PROTOGENI_CERTIFICATE": str(tmp_path / "nope.pem")})
    assert "(from $PROTOGENI_CERTIFICATE)" in str(err.value)


def test_create_sliver_of_an_oversize_or_binary_file_is_one_line(tmp_path):
    big = tmp_path / "big.xml"
    with open(big, "wb") as handle:
        handle.truncate(65 * 1024 * 1024)  # sparse: costs no disk
    binary = tmp_path / "bin.xml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path, expected in ((big, "larger than the limit"), (binary, "not UTF-8 text")):
        result = CliRunner().invoke(cli, ["--config", str(tmp_path / "none.conf"),
                                          "create-sliver", str(path)])
        assert result.exit_code == 1 and expected in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
