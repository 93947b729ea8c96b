"""The INI client configuration and the passphrase sources."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from elasticslice.config import ClientConfig, load_config, load_passphrase
from elasticslice.errors import ConfigError
from tests.helpers import REPO

from .tlsserver import Pki


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def _write(tmp_path, certs, **over):
    values = {
        "certificate": str(certs.user),
        "passphrase_file": str(certs.password_file),
        "sa_url": "https://127.0.0.1:12369/protogeni/xmlrpc/sa",
        "cm_urls": "https://a.example:12369/protogeni/xmlrpc/cm,\n"
                   "  https://b.example:12369/protogeni/xmlrpc/cm https://c.example/cm",
        "ca_bundle": str(certs.ca),
        "slice_name": "elastic1",
        "project": "myproj",
    }
    values.update(over)
    lines = ["[protogeni]"]
    for key, value in values.items():
        if value is not None:
            lines.append(f"{key} = {value}")
    path = tmp_path / "elasticslice.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_full_config(tmp_path, certs):
    path = _write(tmp_path, certs, timeout="7.5", retries="2", verify="yes")
    cfg = load_config(path, env={})
    assert isinstance(cfg, ClientConfig)
    assert cfg.cm_urls == ("https://a.example:12369/protogeni/xmlrpc/cm",
                           "https://b.example:12369/protogeni/xmlrpc/cm",
                           "https://c.example/cm")
    assert cfg.certificate == certs.user and cfg.ca_bundle == certs.ca
    assert (cfg.timeout, cfg.retries, cfg.verify) == (7.5, 2, True)
    assert cfg.slice_name == "elastic1" and cfg.project == "myproj"
    assert load_passphrase(cfg, env={}) == certs.PASSWORD


def test_relative_paths_are_relative_to_the_file(tmp_path, certs):
    (tmp_path / "u.pem").write_bytes(certs.user.read_bytes())
    cfg = load_config(_write(tmp_path, certs, certificate="u.pem"), env={})
    assert cfg.certificate == tmp_path / "u.pem"


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.conf: config file not found"):
        load_config(tmp_path / "nope.conf", env={})


@pytest.mark.parametrize("key", ["certificate", "cm_urls"])
def test_missing_required_key_names_key_and_file(tmp_path, certs, key):
    path = _write(tmp_path, certs, **{key: None})
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.key == key and info.value.path == str(path)
    assert f"[{key}]" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("key,value,needle", [
    ("timeout", "soon", "not a number"),
    ("retries", "-1", "at least"),
    ("verify", "maybe", "not a boolean"),
    ("cm_urls", "http://insecure/cm", "not an https URL"),
    ("sa_url", "ftp://x", "not an https URL"),
    ("ca_bundle", "/no/such/ca.pem", "no such file"),
    ("certificate", "/no/such/user.pem", "no such file"),
    ("slice_name", "bad name!", "invalid slice name"),
])
def test_bad_values_name_the_key(tmp_path, certs, key, value, needle):
    with pytest.raises(ConfigError, match=needle) as info:
        load_config(_write(tmp_path, certs, **{key: value}), env={})
    assert info.value.key == key


def test_unknown_key_is_refused_other_sections_are_not_ours(tmp_path, certs):
    path = _write(tmp_path, certs, colour="blue")
    with pytest.raises(ConfigError, match="unknown key") as info:
        load_config(path, env={})
    assert info.value.key == "colour"
    path = _write(tmp_path, certs)
    path.write_text(path.read_text() + "\n[emulator]\ndynslice_url = https://x/dynslice\n")
    assert load_config(path, env={}).slice_name == "elastic1"


def test_dynslice_urls_pair_with_cms(tmp_path, certs):
    with pytest.raises(ConfigError, match="one URL per cm_urls") as info:
        load_config(_write(tmp_path, certs, dynslice_urls="https://x/dynslice"), env={})
    assert info.value.key == "dynslice_urls"


def test_ca_bundle_required_unless_verification_off(tmp_path, certs):
    with pytest.raises(ConfigError, match="ca_bundle"):
        load_config(_write(tmp_path, certs, ca_bundle=None), env={})
    cfg = load_config(_write(tmp_path, certs, ca_bundle=None, verify="false"), env={})
    assert cfg.verify is False


def test_environment_overrides(tmp_path, certs):
    path = _write(tmp_path, certs)
    cfg = load_config(path, env={"ELASTICSLICE_SLICE_NAME": "other",
                                 "ELASTICSLICE_CM_URLS": "https://x.example/cm"})
    assert cfg.slice_name == "other" and cfg.cm_urls == ("https://x.example/cm",)


def test_passphrase_from_environment_and_none_available(tmp_path, certs):
    cfg = load_config(_write(tmp_path, certs, passphrase_file=None), env={})
    assert load_passphrase(cfg, env={"PROTOGENI_PASSPHRASE": "pw"}) == "pw"
    with pytest.raises(ConfigError, match="no passphrase") as info:
        load_passphrase(cfg, env={}, interactive=False)
    assert info.value.key == "passphrase_file"


def test_slice_name_required_only_when_used(tmp_path, certs):
    cfg = load_config(_write(tmp_path, certs, slice_name=None), env={})
    with pytest.raises(ConfigError, match=r"\[slice_name\] missing"):
        cfg.require_slice_name()


@pytest.mark.parametrize("key", ["certificate", "ca_bundle", "passphrase_file"])
def test_a_directory_where_a_file_belongs_is_named_as_such(tmp_path, certs, key):
    """Broke: a certificate path that is a directory was reported as "no such file"."""
    folder = tmp_path / "pems"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, certs, **{key: str(folder)}), env={})
    assert info.value.key == key
    assert str(info.value).endswith(f"[{key}] {folder} is a directory, not a file")


def test_a_path_under_a_file(tmp_path, certs):
    below = f"{certs.user}/x"
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, certs, certificate=below), env={})
    assert str(info.value).endswith(f"[certificate] no such file: {below} (part of the path is "
                                    f"a file, not a directory)")


def test_config_path_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory, not a config file"):
        load_config(tmp_path, env={})


def _run_unprivileged(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """The CLI in a process that cannot read a mode-000 file, even as root (root loses
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH for that process), so that reading one really
    fails with PermissionError."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        probe = subprocess.run([setpriv, "--bounding-set", "-dac_override,-dac_read_search",
                                "true"], capture_output=True) if setpriv else None
        if probe is None or probe.returncode != 0:
            pytest.skip("running as root without setpriv able to drop CAP_DAC_OVERRIDE")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, sys.executable, "-m", "elasticslice.cli", *args],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, **env},
                          timeout=120)


@pytest.mark.parametrize("key", [None, "certificate", "ca_bundle"])
def test_an_unreadable_config_or_pem_is_one_line(tmp_path, certs, key):
    """Broke: an unreadable config was "no [protogeni] section"; unreadable PEMs quoted
    Python's OSError."""
    home = tmp_path / "home"
    (home / ".protogeni").mkdir(parents=True)
    secret = tmp_path / "secret.pem"
    if key is None:  # the default config, ~/.protogeni/elasticslice.conf
        secret = home / ".protogeni" / "elasticslice.conf"
        secret.write_text(_write(tmp_path, certs).read_text())
        expected = f"Error: {secret}: cannot read the config file: permission denied"
    else:
        secret.write_bytes(getattr(certs, {"certificate": "user"}.get(key, "ca")).read_bytes())
        conf = _write(tmp_path, certs, **{key: str(secret)})
        os.replace(conf, home / ".protogeni" / "elasticslice.conf")
        expected = (f"Error: {home / '.protogeni' / 'elasticslice.conf'}: [{key}] cannot read "
                    f"{secret}: permission denied")
    secret.chmod(0)
    proc = _run_unprivileged(["getversion"], {"HOME": str(home)})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [expected]
