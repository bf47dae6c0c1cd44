"""New processes for the entry points without their start-up: `Popen` and `run` as in `subprocess`, for
`python <script>.py ...` and `python -m <module> ...`.

Every train.py, eval.py or benchmark process a test starts would spend about 10 of its seconds importing torch,
Lightning (which imports torchmetrics, and torchmetrics imports torchvision, scipy and transformers) and Hydra. A
server process (one per test process, started at the first use) imports them once and forks one child per command:
the child is a new process with its own pid, process group, working directory, environment, arguments and standard
streams, that runs the script as `python` runs it (`__main__`, sys.path[0], sys.exit codes, atexit handlers) and can
be signalled, killed and waited for like any other. What it shares with its siblings is only the imported modules.

A variable that a preloaded module reads when it is imported (OMP_NUM_THREADS, HF_HUB_OFFLINE, HOME, TMPDIR, ...)
cannot change in a forked child: a command whose environment differs from the server's in one of them, anything
other than a script or a module, and every command when ATTNLAB_TEST_PREFORK=0 (in the tests' environment or the
command's), run as a real `python` process. PYTHONPATH is the exception: the child's sys.path is made from it as
the interpreter makes it, unless it would shadow a module the server imported or run a sitecustomize
(Server.shadowed). A forked run ends with the modules a new process ends with (tests/test_prefork.py
compares them).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# what every entry point imports before its work (and Lightning after these)
PRELOAD = ["attnlab.cli.app", "hydra", "omegaconf", "attnlab.config"]
# environment variables that the interpreter or a preloaded module reads at start-up or import (and so the server's
# values would win); not those the libraries set themselves while a test trains in the worker (Lightning's PL_*,
# PYTORCH_NVML_BASED_CUDA_CHECK, KMP_*, inductor's cache folder), which the child's run sets again
IMPORT_TIME = ("PYTHON", "OMP_", "MKL_", "TORCH_", "TORCHDYNAMO", "TORCHINDUCTOR", "CUDA", "HF_", "HUGGINGFACE",
               "TRANSFORMERS", "TOKENIZERS", "HOME", "TMPDIR", "XDG_", "MPL", "LD_", "MALLOC")
IMPORT_TIME_EXCEPT = {"PYTHONUNBUFFERED",  # the server's streams are unbuffered
                      "PYTHONPATH",  # put on the child's sys.path as the interpreter would (Server.shadowed)
                      "TORCHINDUCTOR_CACHE_DIR"}  # read when inductor compiles

SERVER = r'''
import importlib, json, os, random, runpy, signal, socket, sys, threading


def python_path(env):
    """The entries PYTHONPATH puts on sys.path, as the interpreter puts them: absolute, an empty one the folder."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(p) for p in value.split(os.pathsep)] if value else []


for name in sys.argv[2].split(","):
    __import__(name)
import lightning
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(16)
server.settimeout(2.0)
parent = os.getppid()
# the server's own PYTHONPATH entries on sys.path, as the interpreter made them (absolute, from its start folder)
OWN_PATH = python_path(os.environ)
print("ready", json.dumps(sorted({name.partition(".")[0] for name in sys.modules})), flush=True)


def child(request):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the child's PYTHONPATH in place of the server's (Server.accepts: it shadows no module the server imported)
    rest = [p for p in sys.path[1:] if p not in OWN_PATH]
    sys.path[1:] = list(dict.fromkeys(python_path(os.environ) + rest))
    importlib.invalidate_caches()
    random.seed()
    sys.argv = list(request["argv"])
    from attnlab.cli.app import run_process  # the end of a process, as the entry points end theirs

    def main():
        if request["module"]:
            sys.path[0] = os.getcwd()
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
            runpy.run_path(sys.argv[0], run_name="__main__")

    run_process(main)  # an uncaught exception: its traceback, then exit status 1, as python does


def reap(conn, pid):
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    finally:
        conn.close()


while os.getppid() == parent:
    try:
        conn, _ = server.accept()
    except socket.timeout:
        continue
    conn.settimeout(None)
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not message.endswith(b"\n"):
        message += conn.recv(1 << 20)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        server.close()
        conn.close()
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        child(request)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    threading.Thread(target=reap, args=(conn, pid), daemon=True).start()
'''


_base_env: dict | None = None


def configure(env) -> None:
    """The environment the server will import under (by default the one at the first command)."""
    global _base_env
    _base_env = dict(env)


class Server:
    """The forking server of this process, started at the first command."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="attnlab-prefork-")
        self.address = os.path.join(self.folder, "socket")
        self.env = dict(_base_env if _base_env is not None else os.environ)
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", SERVER, self.address, ",".join(PRELOAD)],
                                     env=self.env, cwd=self.folder, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True)
        ready, _, imported = self.proc.stdout.readline().strip().partition(" ")
        if ready != "ready":
            raise RuntimeError(f"the prefork server did not start (exit {self.proc.wait()})")
        self.imported = set(json.loads(imported))  # the top-level modules the server imported
        self.children: set[Forked] = set()
        atexit.register(self.close)

    def accepts(self, env: dict, cwd: str) -> bool:
        keys = {k for k in set(env) | set(self.env) if k.startswith(IMPORT_TIME) and k not in IMPORT_TIME_EXCEPT}
        return all(env.get(k) == self.env.get(k) for k in keys) and not self.shadowed(env, cwd)

    def shadowed(self, env: dict, cwd: str) -> set[str]:
        """What a PYTHONPATH of the command's, not the server's, would import in place of a module the server has
        imported (a wheel's site folder with attnlab in it), or would run as the interpreter starts (sitecustomize):
        such a command runs as a real process."""
        value, own = env.get("PYTHONPATH", ""), self.env.get("PYTHONPATH", "")
        folders = [os.path.join(cwd, p) for p in value.split(os.pathsep)] if value and value != own else []
        names = set()
        for folder in folders:
            try:
                names |= {entry.partition(".")[0] for entry in os.listdir(folder)}
            except OSError:
                continue
        return names & (self.imported | {"sitecustomize", "usercustomize"})

    def close(self) -> None:
        for child in list(self.children):  # what is still running when the tests end (interrupted, failed)
            try:
                os.killpg(child.pid, 9)
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait()
        for path in (self.address, self.folder):
            try:
                os.unlink(path) if path == self.address else os.rmdir(path)
            except OSError:
                pass


_server: Server | None = None


def server() -> Server:
    global _server
    if _server is None:
        _server = Server()
    return _server


def _fd(spec, default: int | None, opened: list) -> tuple[int, int | None]:
    """(the child's end, our reading end or None) for a stdout/stderr/stdin argument of subprocess.Popen."""
    if spec is None:
        return default, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        opened.append(w)
        return w, r
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd, None
    return (spec if isinstance(spec, int) else spec.fileno()), None


class Forked:
    """A forked child, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, args, module, cwd, env, stdout, stderr, text):
        self.args, self.returncode = args, None
        opened: list[int] = []
        stdin, _ = _fd(subprocess.DEVNULL, None, opened)
        out, out_r = _fd(stdout, 1, opened)
        err, err_r = (out, None) if stderr == subprocess.STDOUT else _fd(stderr, 2, opened)
        self.conn = socket.socket(socket.AF_UNIX)
        self.conn.connect(server().address)
        request = {"argv": args[1:] if module is None else [module, *args[3:]], "module": module,
                   "cwd": str(cwd or os.getcwd()), "env": dict(env if env is not None else os.environ)}
        socket.send_fds(self.conn, [json.dumps(request).encode() + b"\n"], [stdin, out, err])
        for fd in opened:
            os.close(fd)
        self.buffer = b""
        self.pid = self._message(None)["pid"]
        server().children.add(self)
        self.stdout = os.fdopen(out_r, "r" if text else "rb") if out_r is not None else None
        self.stderr = os.fdopen(err_r, "r" if text else "rb") if err_r is not None else None

    def _message(self, timeout: float | None) -> dict | None:
        """The server's next line, or None when none came within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:
                raise RuntimeError("the prefork server ended")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def poll(self):
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            message = self._message(timeout)
            if message is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = message["returncode"]
            self.conn.close()
            server().children.discard(self)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        outputs: dict = {}
        streams = {name: s for name, s in (("out", self.stdout), ("err", self.stderr)) if s is not None}
        threads = [threading.Thread(target=lambda n=n, s=s: outputs.__setitem__(n, s.read()), daemon=True)
                   for n, s in streams.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        for s in streams.values():
            s.close()
        self.stdout = self.stderr = None
        return outputs.get("out"), outputs.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)


def Popen(args, cwd=None, env=None, stdout=None, stderr=None, text=False, start_new_session=False, **kwargs):
    """subprocess.Popen, forked from the server for `python <file>.py ...` and `python -m <module> ...` (a forked
    child always leads its own process group, as with start_new_session=True)."""
    args = [str(a) for a in args]
    script = len(args) > 1 and args[0] == sys.executable and args[1].endswith(".py") and Path(args[1]).is_file()
    module = args[2] if len(args) > 2 and args[0] == sys.executable and args[1] == "-m" else None
    env_of_child = env if env is not None else dict(os.environ)
    if (os.environ.get("ATTNLAB_TEST_PREFORK") == "0" or env_of_child.get("ATTNLAB_TEST_PREFORK") == "0"
            or not (script or module) or kwargs or not server().accepts(env_of_child, str(cwd or os.getcwd()))):
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text,
                                start_new_session=start_new_session, **kwargs)
    return Forked(args, module, cwd, env, stdout, stderr, text)


def run(args, cwd=None, env=None, stdout=None, stderr=None, text=False, timeout=None, capture_output=False):
    """subprocess.run through Popen; on a timeout the child's process group is killed."""
    if capture_output:
        stdout, stderr = subprocess.PIPE, subprocess.PIPE
    proc = Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
