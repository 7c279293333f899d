"""A root-side launch agent: starts commands outside the asking server's cgroup and namespace.

What ``systemd-run`` is to SystemdSpawner (it asks systemd, over D-Bus, to start a unit of its
own), this is to the tests' hub, where no systemd runs: the agent is started by the test
fixture, outside every user server; a server's ``command`` launcher template runs this module
as a client, which hands the command line and its environment over a Unix socket and returns
once the agent has started it (in a session of its own, in the agent's own cgroup, in the
host's PID namespace), as ``systemd-run`` returns once its unit runs::

    FTNB_LAUNCHER_COMMAND='python launch_agent.py --socket /run/agent.sock -- {command}'

``python launch_agent.py --serve --socket PATH [--cgroup NAME] --log FILE`` runs the agent.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spawners import UNIT_ENV, ProcessGroupUnit


def serve(socket_path: str, unit: ProcessGroupUnit | None, log_path: str) -> None:
    with open(log_path, "ab", buffering=0) as log:
        _serve(socket_path, unit, log)


def _serve(socket_path: str, unit: ProcessGroupUnit | None, log) -> None:

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request = json.loads(self.rfile.readline())
            env = dict(request["env"])
            env.pop(UNIT_ENV, None)  # a unit of the agent's, not of the asking server
            if unit is not None and unit.kind == "environment":
                env[UNIT_ENV] = unit.name
            try:
                proc = subprocess.Popen(
                    request["argv"], cwd=request["cwd"], env=env, start_new_session=True,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    # (only writes a number to a file between fork and exec)
                    preexec_fn=unit.join if unit is not None else None)  # noqa: PLW1509
            except OSError as error:
                self.wfile.write(json.dumps({"error": str(error)}).encode() + b"\n")
                return
            threading.Thread(target=proc.wait, daemon=True).start()  # reaps it
            self.wfile.write(json.dumps({"pid": proc.pid}).encode() + b"\n")

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    with Server(socket_path, Handler) as server:
        server.serve_forever()


def ask(socket_path: str, argv: list[str]) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(socket_path)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = json.loads(conn.makefile("rb").readline())
    if "error" in reply:
        print(f"launch agent: {reply['error']}", file=sys.stderr)
        return 1
    print(f"launch agent started pid {reply['pid']}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--cgroup", help="the unit the agent's commands run in")
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("argv", nargs="*")
    args = parser.parse_args()
    if args.serve:
        serve(args.socket, ProcessGroupUnit(args.cgroup) if args.cgroup else None, args.log)
        return 0
    return ask(args.socket, args.argv)


if __name__ == "__main__":
    sys.exit(main())
