"""The tarball rule (Emulab's tbsetup/tarfiles_setup), one rule for every entry point: the
emulator's CM, rspec validate, the manager config's tarballs and the client's AddNodes."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from elasticslice.errors import ConfigError
from elasticslice.managers.config import load_manager_config
from elasticslice.rspec import NodeSpec, add_nodes_args, build_request, validate
from elasticslice.rspec.addnodes import BadAddNodesArgs
from elasticslice.rspec.tarball import extension, stored_name, tarball_problem


@pytest.mark.parametrize("url", [
    "http://example.org/app.tar.gz", "https://h:8443/a/b/app.tgz", "ftp://h/x.tar",
    "http://127.0.0.1:8080/Tok-en_1/node-1.tar.gz", "https://h/x.tar.Z", "https://h/x.bz2",
    "http://h/x.rpm", "https://user@h/~me/x.tgz", "/proj/myproj/app.tar.gz"])
def test_what_cloudlab_takes(url: str) -> None:
    assert tarball_problem(url) is None


@pytest.mark.parametrize("url,said", [
    ("file:///tmp/app.tgz", "file:// URLs are refused"),
    ("http://h/app.tgz?v=1", "query string"),
    ("http://h/app.tgz#x", "query string"),
    ("http://h/app.zip", "does not match the rule"),
    ("http://h/app tar.gz", "does not match the rule"),
    ("http://h/%41.tgz", "does not match the rule"),
    ("gopher://h/app.tgz", "does not match the rule"),
    ("app.tar.gz", "neither a URL"),
    ("/proj/../etc/x.tgz", "neither a URL"),
    ("", "not a URL"),
    (None, "not a URL"),
    ("http://h/" + "a" * 2000 + ".tgz", "longer than"),
])
def test_what_cloudlab_refuses_and_why(url: object, said: str) -> None:
    problem = tarball_problem(url)
    assert problem is not None and said in problem and "\n" not in problem


def test_the_testbed_keeps_a_tarball_as_the_md5_of_its_url() -> None:
    url = "https://example.org/dist/app.tar.gz"
    assert extension(url) == "tar.gz" and extension("http://h/x.tgz") == "tgz"
    assert stored_name(url) == f"{hashlib.md5(url.encode()).hexdigest()}.tar.gz"


def test_add_nodes_args_send_bare_urls_and_refuse_another_path() -> None:
    """GeniCMV2.pm.in AddNodes: ``<install url='$tarball' install_path='/'/>`` (the box took
    a ``[url, path]`` pair as an extension of its own)."""
    spec = NodeSpec("n1", installs=[("https://h/a.tgz", "/"), ("https://h/c.tgz", "")])
    assert add_nodes_args([spec])["n1"]["tarballs"] == ["https://h/a.tgz", "https://h/c.tgz"]
    with pytest.raises(BadAddNodesArgs, match=r"nodes\[n1\]\.tarballs\[0\]: .*at /"):
        add_nodes_args([NodeSpec("n1", installs=[("https://h/b.tgz", "/opt/b")])])
    with pytest.raises(BadAddNodesArgs, match=r"nodes\[n1\]\.tarballs\[0\]: .*file://"):
        add_nodes_args([NodeSpec("n1", installs=[("file:///x.tgz", "/")])])


def test_rspec_validate_names_the_line_of_a_bad_tarball() -> None:
    text = build_request([NodeSpec("n1", installs=[("https://h/ok.tgz", "/")]),
                          NodeSpec("n2", installs=[("http://h/x.tgz?a=b", "/local")])],
                         validate=False)
    problems = validate(text)
    assert len(problems) == 1 and "node n2: tarball URL" in problems[0].message
    assert problems[0].line > 0


def test_the_manager_config_holds_tarballs_to_the_rule(tmp_path: Path) -> None:
    conf = tmp_path / "m.conf"
    conf.write_text("[manager]\ntarballs = http://h/app.tgz?x=1 /local\n")
    with pytest.raises(ConfigError, match="query string"):
        load_manager_config(conf)
