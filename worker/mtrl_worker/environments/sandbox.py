"""Run policy-written code against unit tests in a separate, limited process.

Limits, and how honest they are:
- Wall time: the parent kills the whole process group after `timeout_s`; CPU time is also
  capped with RLIMIT_CPU, so a busy loop dies even if the parent is slow.
- Memory: RLIMIT_AS caps the address space; files: RLIMIT_FSIZE, and the run happens in a fresh
  temporary directory.
- Network: where `unshare --net` works (root, or unprivileged user namespaces), the process gets
  an empty network namespace: a real boundary. Otherwise, and in addition, an audit hook refuses
  sockets, subprocesses and ctypes. An audit hook is NOT a security boundary (code can reach
  around it); it stops accidents and naive exploits. Run workers with a NetworkPolicy or a
  sandboxed runtime (gVisor, Firecracker) where the code may be adversarial.
- Result forgery: the harness reads a random nonce from stdin before the submission is loaded
  and keeps it in a local, so printing a fake report does not work by accident; a submission
  that walks the interpreter's frames could still find it (blocking sys._getframe would break
  namedtuple and typing). Expected values are compared with exact types, so an object whose
  __eq__ always returns True earns nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HARNESS = r"""
import ast, json, resource, sys


def main():
    nonce = sys.stdin.readline().strip()  # a local: not reachable as a module global
    limits = json.loads(sys.stdin.readline())
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    tests = [(call, ast.literal_eval(expected)) for call, expected in
             json.loads(sys.stdin.readline())]
    source = sys.stdin.read()
    write, flush, type_, len_, zip_ = sys.stdout.write, sys.stdout.flush, type, len, zip
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
               "os.spawn", "ctypes.", "pty.")

    def guard(event, args):
        if event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")

    def same(a, b):
        # Exact types all the way down: an object whose __eq__ always says True fails here.
        if type_(a) is not type_(b):
            return False
        if type_(a) in (list, tuple):
            return len_(a) == len_(b) and all(same(x, y) for x, y in zip_(a, b))
        if type_(a) is dict:
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b

    sys.addaudithook(guard)
    passed, error = 0, None
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:
        error = f"{type_(exc).__name__}: {exc}"
    else:
        for call, expected in tests:
            try:
                ok = same(eval(call, namespace), expected)
            except ValueError as exc:
                ok = expected == "!ValueError" and type_(exc) is ValueError
            except BaseException:
                ok = False
            passed += bool(ok)
    write(nonce + json.dumps({"passed": passed, "error": error}) + "\n")
    flush()


main()
"""


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    timed_out: bool = False
    error: str | None = None

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


@functools.cache
def _isolation_prefix() -> tuple[str, ...]:
    for prefix in (("unshare", "--net", "--map-root-user"), ("unshare", "--net")):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
            if done.returncode == 0:
                return prefix
    return ()


def network_isolated() -> bool:
    return bool(_isolation_prefix())


async def run_tests(
    source: str,
    tests: list[tuple[str, str]],
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
) -> SandboxResult:
    """Each test is (call, expected): `call` is evaluated with the solution loaded and must
    equal the Python literal `expected` with exactly the same types; an expected "!ValueError"
    means the call must raise ValueError."""
    nonce = secrets.token_hex(16)
    limits = {"memory_bytes": memory_mb << 20, "cpu_s": max(1, int(timeout_s) + 1)}
    stdin = "\n".join([nonce, json.dumps(limits), json.dumps(tests), source]).encode()
    with tempfile.TemporaryDirectory(prefix="mtrl-sandbox-") as workdir:
        harness = Path(workdir) / "harness.py"
        harness.write_text(HARNESS)
        proc = await asyncio.create_subprocess_exec(
            *_isolation_prefix(),
            sys.executable,
            "-I",
            "-S",
            str(harness),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env={"PATH": os.defpath, "PYTHONHASHSEED": "0"},
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return SandboxResult(0, len(tests), timed_out=True, error="timeout")
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(nonce):
            report = json.loads(line[len(nonce) :])
            return SandboxResult(report["passed"], len(tests), error=report["error"])
    if proc.returncode == -signal.SIGXCPU:
        return SandboxResult(0, len(tests), timed_out=True, error="cpu time limit")
    last_lines = stderr.decode(errors="replace").strip().splitlines()[-1:]
    reason = last_lines[0] if last_lines else f"exit {proc.returncode}"
    return SandboxResult(0, len(tests), error=reason[:200])
