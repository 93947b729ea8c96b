"""Which wheels fit a node: the rules the wheelhouse root and the node's installer share,
checked against pip's own (``packaging.tags``), and the names of the nodes' wheelhouses."""
from __future__ import annotations

import configparser
import itertools

import pytest
from packaging import tags as ptags
from packaging.utils import parse_wheel_filename

from elasticslice.pilots import wheeltags
from elasticslice.pilots.wheelhouse import this_platform
from tests.helpers import REPO

WHEELS = [
    "dask-2026.8.0-py3-none-any.whl",
    "locket-1.0.0-py2.py3-none-any.whl",
    "six-1.16.0-py2-none-any.whl",
    "tomli-2.0.1-py311-none-any.whl",
    "exceptiongroup-1.2.0-py310-none-any.whl",
    "psutil-7.2.2-cp36-abi3-manylinux_2_12_x86_64.manylinux2010_x86_64.manylinux_2_17_x86_64"
    ".manylinux2014_x86_64.whl",
    "psutil-7.2.2-cp36-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "tornado-6.6.1-cp311-abi3-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
    "cryptography-50.0.2-cp311-abi3-manylinux_2_34_aarch64.whl",
    "cryptography-50.0.2-cp311-abi3-manylinux_2_28_x86_64.whl",
    "pyyaml-6.0.4-cp310-cp310-manylinux2014_x86_64.manylinux_2_17_x86_64"
    ".manylinux_2_28_x86_64.whl",
    "pyyaml-6.0.4-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "msgpack-1.2.4-cp37-cp37m-manylinux1_x86_64.whl",
    "cffi-2.1.1-cp313-cp313t-manylinux_2_17_x86_64.whl",
    "markupsafe-3.0.4-cp310-cp310-musllinux_1_2_x86_64.whl",
    "lxml-6.1.3-cp310-cp310-linux_x86_64.whl",
    "numpy-2.0.0-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl",
    "psutil-7.2.2-cp36-abi3-macosx_11_0_arm64.whl",
]
NODES = [((major, minor), arch, glibc) for (major, minor), arch, glibc in itertools.product(
    [(3, 7), (3, 10), (3, 11), (3, 12), (3, 13)], ["x86_64", "aarch64"],
    [(2, 17), (2, 31), (2, 36), None])]


def pip_says(wheel: str, python: tuple[int, int], arch: str,
             glibc: tuple[int, int] | None) -> bool:
    """What pip would do on that node: the wheel's tags against the node's supported tags
    (``packaging.tags``, as pip computes them for CPython on Linux)."""
    if glibc is None:
        platforms = [f"linux_{arch}"]
    else:
        platforms = [tag for minor in range(glibc[1], 4, -1) for tag in (
            f"manylinux_2_{minor}_{arch}", *([{17: "manylinux2014", 12: "manylinux2010",
                                               5: "manylinux1"}[minor] + f"_{arch}"]
                                             if minor in (5, 12, 17) else []))]
        platforms.append(f"linux_{arch}")
    abis = [f"cp{python[0]}{python[1]}"] + (["cp37m"] if python == (3, 7) else [])
    supported = {*ptags.cpython_tags(python, abis=abis, platforms=platforms),
                 *ptags.compatible_tags(python, f"cp{python[0]}{python[1]}", platforms)}
    return bool(parse_wheel_filename(wheel)[3] & supported)


@pytest.mark.parametrize("node", NODES, ids=lambda n: wheeltags.describe(*n))
def test_a_wheel_fits_a_node_where_pip_would_install_it(node) -> None:  # noqa: ANN001
    for wheel in WHEELS:
        problem = wheeltags.wheel_problem(wheel, *node)
        assert (problem is None) == pip_says(wheel, *node), (wheel, problem)


def test_a_wheel_that_does_not_fit_says_why() -> None:
    arm = ((3, 11), "aarch64", (2, 36))
    assert wheeltags.wheel_problem("cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17"
                                   "_x86_64.whl", *arm) == (
        "its platform tag manylinux2014_x86_64.manylinux_2_17_x86_64 is not for linux-aarch64")
    assert wheeltags.wheel_problem("cryptography-50.0.2-cp311-abi3-manylinux_2_34_aarch64.whl",
                                   (3, 11), "aarch64", (2, 31)) == (
        "its platform tag manylinux_2_34_aarch64 needs a newer glibc than the node's 2.31")
    assert wheeltags.wheel_problem("pyyaml-6.0.4-cp311-cp311-manylinux_2_17_aarch64.whl",
                                   (3, 10), "aarch64", (2, 35)) == (
        "its Python tag cp311-cp311 is not for Python 3.10")
    assert wheeltags.wheel_problem("not-a-wheel.zip", *arm) == (
        "its name is not a wheel's (NAME-VERSION-PY-ABI-PLATFORM.whl)")


def test_a_nodes_wheelhouse_is_named_for_its_python_machine_and_glibc() -> None:
    assert wheeltags.node_tag((3, 10), "manylinux_2_35_aarch64") == "cp310-manylinux_2_35_aarch64"
    assert wheeltags.parse_node_tag("cp310-manylinux_2_35_aarch64") == ((3, 10), "aarch64",
                                                                         (2, 35))
    assert wheeltags.parse_node_tag("cp314-manylinux_2_39_x86_64") == ((3, 14), "x86_64",
                                                                       (2, 39))
    refused = {
        "cp37-manylinux_2_35_x86_64": "Python 3.7: this control node builds wheelhouses for "
                                      "Python 3.8 to 3.14",
        "cp315-manylinux_2_35_x86_64": "Python 3.15: this control node builds",
        "cp312-manylinux_2_35_riscv64": "machine riscv64: this control node builds wheelhouses "
                                        "for x86_64 and aarch64",
        "cp312-linux_x86_64": "a node without glibc (linux_x86_64): this control node builds "
                              "manylinux wheelhouses only",
        "cp312-manylinux_3_1_x86_64": "glibc 3.1 is not one a manylinux wheel names",
        "wheels.txt": "'wheels.txt' is not a wheelhouse name",
        "cp312-manylinux_2_35_x86_64-parsl": "is not a wheelhouse name",
    }
    for tag, why in refused.items():
        with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
            wheeltags.parse_node_tag(tag)


def test_this_machine_as_a_node_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc from ``os.confstr`` (Python 3.6's ``platform.libc_ver`` names the newest symbol
    the interpreter links instead); the box labels an ARM64 image's Python with
    ``_PYTHON_HOST_PLATFORM``, which the machine follows."""
    import os
    assert wheeltags.glibc_version() == tuple(
        int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    assert this_platform() == wheeltags.this_platform() == wheeltags.platform_tag(
        wheeltags.machine(), wheeltags.glibc_version())
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", "linux-aarch64")
    assert wheeltags.machine() == "aarch64"
    assert wheeltags.this_platform() == "manylinux_%d_%d_aarch64" % wheeltags.glibc_version()


def test_the_agents_python_floor_is_setup_cfgs() -> None:
    """One fact: the nodes' floor (installer, root, doctor) is the distribution's own."""
    from elasticslice.commands.doctor import MIN_NODE_PYTHON
    from elasticslice.pilots.bootstrap import MIN_NODE_PYTHON as BOOTSTRAP_MIN
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    floor = "%d.%d" % wheeltags.MIN_PYTHON
    assert cfg["options"]["python_requires"] == f">={floor}"
    assert f"Programming Language :: Python :: {floor}" in cfg["metadata"]["classifiers"]
    assert MIN_NODE_PYTHON == BOOTSTRAP_MIN == wheeltags.MIN_PYTHON == (3, 10)
