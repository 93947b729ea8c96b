"""Inventory files: mistakes used to be accepted silently (unknown keys), to hang the server
(a huge count builds millions of node rows), or to print configparser's multi-line message."""
from __future__ import annotations

import pytest

from elasticslice.emulator.pool import load_inventory
from elasticslice.errors import ConfigError

TYPE = "count = 2\ncores = 4\nmemory = 1024\n"


@pytest.mark.parametrize("text, expected", [
    (f"[m400]\n{TYPE}colour = red\n", "[m400.colour] unknown key"),
    (f"[inventory]\ndefault_type = m400\n[m400]\n{TYPE}", "[inventory.default_type] unknown key"),
    ("[m400]\ncount = 100000000\ncores = 4\n", "[m400.count] at most 10000"),
    ("[m400]\ncount = 2\ncores = 4\nmemory = 99999999999\n", "[m400.memory] at most"),
    ("nonsense\n", "not an INI file: line 1 comes before any [section] header"),
    (f"[m400]\n{TYPE}count = 3\n", "line 5: key 'count' given twice in [m400]"),
    ("[a]\ncount = 100\ncores = 1\nprefix = pc\n[b]\ncount = 2\ncores = 1\nprefix = pc0\n",
     "[b.prefix] node names pc0... collide"),
])
def test_bad_inventory_is_one_line_naming_key_and_file(tmp_path, text, expected):
    inv = tmp_path / "inv.ini"
    inv.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_inventory(inv)
    message = str(err.value)
    assert message.startswith(f"{inv}: ") and expected in message
    assert "\n" not in message


def test_shipped_inventory_loads(repo_root):
    inv = load_inventory(repo_root / "etc" / "emulator-inventory.ini")
    assert {"m400", "m510", "xl170", "d430"} <= set(inv.types)
