"""Start the tutorials' ``rnnkit`` and ``python`` commands without importing torch each time.

Each command of a tutorial is a new process, and a new Python process spends ~1.8 s of
CPU importing torch before it does anything: most of what the tutorials cost at the
test's small budget. ``python forkserver.py SOCKET`` imports rnnkit (and so torch) once
and then forks one child per command, which runs it as a fresh interpreter would: the
command's own standard input, output and error (passed over the socket), working
directory, environment and arguments, and its exit status sent back.

``python forkserver.py --client SOCKET rnnkit|python ARGS...`` is the other end, the
``rnnkit`` and ``python`` on the ``PATH`` of the shell blocks (``mdexec.shell_env``).
A ``python`` command the server does not run itself (a script, an option other than
``-c``, ``-m`` or ``-``) runs in a real interpreter with the same arguments.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import socket
import struct
import sys
import traceback

HEADER = struct.Struct("!Q")
STATUS = struct.Struct("!i")


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return data


# ---- the client: the rnnkit and python of the shell blocks ---------------------------------


def client(path: str, kind: str, argv: list[str]) -> int:
    """Send one command with this process's stdin, stdout and stderr; its exit status."""
    if kind == "python" and argv[:1] not in (["-c"], ["-m"], ["-"]):
        os.execv(sys.executable, [sys.executable, *argv])  # a script, an option: the real one
    steps = os.environ.get("DOCS_EXEC_STEPS")
    if kind == "rnnkit" and argv[:1] == ["train"] and steps:
        argv = [*argv, "--steps", steps]  # the test's budget: the last --steps wins
    payload = json.dumps(
        {"kind": kind, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
        conn.sendall(payload)
        (status,) = STATUS.unpack(_recv_exactly(conn, STATUS.size))
    return status


# ---- the server ------------------------------------------------------------------------


def _run(kind: str, argv: list[str]) -> int:
    """Run one command in this (forked) process as its own interpreter would."""
    from rnnkit.app.cli.main import main

    try:
        if kind == "rnnkit":
            sys.argv = ["rnnkit", *argv]
            return int(main(argv) or 0)
        # sys.path[0] as Python sets it: the working directory ("" for -c and -).
        if argv[0] == "-c":
            sys.path[0], sys.argv = "", ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        elif argv[0] == "-m":
            sys.path[0], sys.argv = os.getcwd(), [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:  # "-": the program on standard input
            sys.path[0], sys.argv = "", ["-", *argv[1:]]
            exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _serve_one(conn: socket.socket) -> None:
    """In the forked child: take the command's files, place and environment, run it,
    send its status back, and leave without running the server's exit handlers."""
    status = 1
    try:
        header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
        request = json.loads(_recv_exactly(conn, HEADER.unpack(header)[0]))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        status = _run(request["kind"], request["argv"])
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        try:
            conn.sendall(STATUS.pack(status))
        finally:
            os._exit(0)


def _stop(signum: int, frame: object) -> None:
    """SIGTERM: wait for the commands still running, then stop (their CPU time then
    counts in the server's, and so in the test's)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            os.wait()
    sys.exit(0)


def serve(path: str) -> None:
    import rnnkit.app.cli.main  # noqa: F401  (the import every command would pay)

    signal.signal(signal.SIGTERM, _stop)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(8)
        print("ready", flush=True)
        while True:
            conn, _ = server.accept()
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                server.close()
                _serve_one(conn)
            conn.close()
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:  # reap the commands that ended
                    pass
            except ChildProcessError:
                pass


if __name__ == "__main__":
    if sys.argv[1] == "--client":
        sys.exit(client(sys.argv[2], sys.argv[3], sys.argv[4:]))
    serve(sys.argv[1])
