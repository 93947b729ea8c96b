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
printed on stderr, exit 1. Standard library only: it runs on the image's python3. One
HTTP/1.0 request on a plain socket (``urllib.request`` would double the command's start-up,
and every node's start-up script runs it).
"""
import json
import os
import socket
import sys
from urllib.parse import quote

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


def _split(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an ``http://HOST:PORT/PATH`` URL."""
    if not url.startswith("http://"):
        raise ValueError(f"the node configuration URL is not http://: {url!r}")
    hostport, _, path = url[len("http://"):].partition("/")
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port), "/" + path.rstrip("/")


def ask(command: str, argument: str = "") -> tuple[int, str]:
    """(exit status, text) of one request."""
    config = _config()
    host, port, path = _split(config["url"])
    path += "/geni/" + quote(command, safe="")
    if argument:
        path += "/" + quote(argument, safe="")
    key = str(config.get("key", ""))
    if any(c in key for c in "\r\n"):
        raise ValueError("the node's key in its configuration is not one line")
    request = (f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nX-Geni-Key: {key}\r\n"
               f"Connection: close\r\n\r\n").encode("utf-8")
    chunks = []
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        conn.sendall(request)
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    words = head.split(b"\r\n", 1)[0].split(None, 2)
    if not sep or len(words) < 2 or not words[0].startswith(b"HTTP/") \
            or not words[1].isdigit():
        raise ValueError("the node configuration server's answer is not HTTP")
    text = body.decode("utf-8", "replace")
    if words[1] == b"200":
        return 0, text
    return 1, text or (words[2].decode("latin-1") if len(words) > 2 else words[1].decode())


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
