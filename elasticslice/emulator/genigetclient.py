#!/usr/bin/python3
"""geni-get: what a node asks the testbed about itself (the box's copy of CloudLab's client).

    geni-get client_id          this node's client_id
    geni-get manifest           the sliver's manifest RSpec (every node, its interfaces)
    geni-get commands           the commands, described
    geni-get param NAME         a profile parameter

On CloudLab it asks the testbed's node configuration server (tmcd, TCP 7777). In the box it
asks the emulator's (``elasticslice.emulator.tmcd``), at the address and with the node's key
in ``/var/emulab/boot/geni/tmcd.json`` (without namespaces: ``$ELASTICSLICE_NODE_DIR/geni``).
The value is printed on stdout, exit 0; a refusal ("not available", "unknown request") is
printed on stderr, exit 1. Standard library only: it runs on the image's python3.
"""
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

CONFIG = "/var/emulab/boot/geni/tmcd.json"
TIMEOUT = 30.0
USAGE = "usage: geni-get [-n] [-a] COMMAND [ARGUMENT]   (geni-get commands: the list)"


def _config() -> dict:
    paths = [CONFIG]
    if os.environ.get("ELASTICSLICE_NODE_DIR"):
        paths.append(os.path.join(os.environ["ELASTICSLICE_NODE_DIR"], "geni", "tmcd.json"))
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            continue
    raise OSError("no node configuration (this is not a node of the box)")


def ask(command: str, argument: str = "") -> tuple[int, str]:
    """(exit status, text) of one request."""
    config = _config()
    path = "/geni/" + urllib.parse.quote(command, safe="")
    if argument:
        path += "/" + urllib.parse.quote(argument, safe="")
    request = urllib.request.Request(config["url"].rstrip("/") + path,
                                     headers={"X-Geni-Key": config.get("key", "")})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=TIMEOUT) as resp:
            return 0, resp.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return 1, err.read().decode("utf-8", "replace") or err.reason


def main(argv: list) -> int:
    args = [a for a in argv[1:] if a != "-n"]  # -n: no cached answer (there is no cache)
    if args[:1] == ["-a"]:
        args = ["all"]
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        return 1 if not args else 0
    try:
        status, text = ask(args[0], " ".join(args[1:]))
    except (OSError, ValueError, KeyError) as err:
        sys.stderr.write(f"geni-get: cannot reach the node configuration server: {err}\n")
        return 1
    out = sys.stdout if status == 0 else sys.stderr
    out.write(text if text.endswith("\n") else text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
