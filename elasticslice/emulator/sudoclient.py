#!/usr/bin/python3
"""sudo: the box's passwordless sudo for a node's users (CloudLab's images give them one).

    sudo [-n] [-E] [-H] [-u USER] [--] [NAME=VALUE...] COMMAND [ARGUMENT...]
    sudo -v

No setuid binary: the node's init serves its users on a UNIX socket (``/run/box-sudo/socket``,
``elasticslice.emulator.nodesudo``). It knows the caller by the kernel's ``SO_PEERCRED`` and
serves the node's users only; it runs COMMAND as USER (root by default) with this process's
stdin, stdout and stderr (passed over ``SCM_RIGHTS``), in its working directory, with an
environment as sudo makes one (``env_reset``: TERM, LANG, LC_*... kept; PATH the
``secure_path``; HOME, USER, LOGNAME, SHELL the target's; SUDO_USER, SUDO_UID, SUDO_GID,
SUDO_COMMAND), and answers its exit status. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to this
process reach the command. ``-E`` keeps this environment (PATH is still the secure one,
HOME stays unless ``-H``); ``-n`` is accepted (no password is ever asked); ``-v`` does
nothing. Any other option is refused in one line.

Without namespaces (the box's fallback) there is no such service: the command runs as the
caller, unchanged (the fallback has no node users). Standard library only: it runs on the
image's python3.
"""
import json
import os
import signal
import socket
import struct
import sys

SOCKET = "/run/box-sudo/socket"
USAGE = ("usage: sudo [-n] [-E] [-H] [-u USER] [--] [NAME=VALUE...] COMMAND [ARGUMENT...]\n"
         "       sudo -v")
SUPPORTED = "-n, -E, -H, -u USER, -v, --"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def fail(message, status=1):
    sys.stderr.write("sudo: " + message + "\n")
    sys.exit(status)


def parse(argv):
    """Options, then the command: (options dict, command list)."""
    opts = {"user": "root", "preserve_env": False, "set_home": False, "validate": False}
    args = list(argv)
    while args and args[0].startswith("-") and args[0] != "-":
        arg = args.pop(0)
        if arg == "--":
            break
        if arg.startswith("--"):
            fail(f"option {arg} is not supported by the box's sudo (it takes {SUPPORTED})")
        letters = arg[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter == "n":
                continue
            if letter == "E":
                opts["preserve_env"] = True
            elif letter == "H":
                opts["set_home"] = True
            elif letter == "v":
                opts["validate"] = True
            elif letter == "u":
                if letters:
                    opts["user"], letters = letters, ""
                elif args:
                    opts["user"] = args.pop(0)
                else:
                    fail("option requires an argument -- 'u'\n" + USAGE)
            else:
                fail(f"option -{letter} is not supported by the box's sudo (it takes "
                     f"{SUPPORTED})")
    settings = {}
    while args and "=" in args[0] and not args[0].startswith("=") and \
            args[0].split("=", 1)[0].replace("_", "a").isalnum():
        name, value = args.pop(0).split("=", 1)
        settings[name] = value
    return opts, settings, args


def fallback(command, settings):
    """No node service and not in a node (the box's fallback): run it as we are."""
    env = dict(os.environ)
    env.update(settings)
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        fail(f"{command[0]}: {err.strerror}")


def send_request(sock, request, fds):
    payload = json.dumps(request).encode("utf-8")
    message = struct.pack("!I", len(payload)) + payload
    sent = sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     struct.pack(f"{len(fds)}i", *fds))])
    if sent < len(message):
        sock.sendall(message[sent:])


def main(argv):
    opts, settings, command = parse(argv)
    if opts["validate"] and not command:
        return 0
    if not command:
        fail("a command is needed\n" + USAGE)
    if not os.path.exists(SOCKET):
        if os.path.isdir(os.environ.get("ELASTICSLICE_NODE_DIR", "/nonexistent/")) or \
                os.geteuid() == 0:
            fallback(command, settings)
        fail(f"the box's sudo service is not running on this node ({SOCKET} is missing)")
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    fds.append(os.open(".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pending = []

    def forward(signum, _frame):
        try:
            sock.sendall(json.dumps({"signal": signum}).encode() + b"\n")
        except OSError:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        sock.connect(SOCKET)
    except OSError as err:
        fail(f"cannot reach the box's sudo service ({SOCKET}): {err.strerror or err}")
    unsent = None
    try:
        send_request(sock, {"argv": command, "user": opts["user"], "env": dict(os.environ),
                            "settings": settings, "preserve_env": opts["preserve_env"],
                            "set_home": opts["set_home"]}, fds)
    except OSError as err:  # it may have answered (and closed) first: a refusal says why
        unsent = err
    for signum in pending:
        forward(signum, None)
    buffer = b""
    while b"\n" not in buffer:
        try:
            chunk = sock.recv(65536)
        except OSError as err:
            chunk, unsent = b"", unsent or err
        if not chunk:
            if unsent is not None:
                fail(f"cannot reach the box's sudo service ({SOCKET}): "
                     f"{unsent.strerror or unsent}")
            fail("the box's sudo service went away before the command ended")
        buffer += chunk
    reply = json.loads(buffer.split(b"\n", 1)[0].decode("utf-8"))
    if reply.get("error"):
        sys.stderr.write(reply["error"] + "\n")
    if reply.get("signal"):
        signal.signal(reply["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), reply["signal"])
    return int(reply.get("status", 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
