"""Hosts made of Linux network namespaces, for cluster tests over a real network.

Each host is a network namespace with its own loopback and one interface, ``eth0``, with an address in
10.77.0.0/24. The hosts are joined by veth pairs to a bridge that lives in a namespace of its own (the
switch), so nothing is added to the machine's own network: no interface, address or route outside the
namespaces this module made. A host has no default route, so a process inside one reaches only the
other hosts (anything else is ENETUNREACH at once: never the internet, never another machine).

A partition pulls the cable: the switch's end of a host's veth goes down, and the host keeps its
address and its loopback, so its own processes still talk to each other. A host is killed by
SIGKILL of every process in its namespace.

Everything is named ``prns-<pid>-...`` after the process that made it; :func:`remove_leftovers`
removes what a crashed run (a pid no longer alive) left behind. :meth:`Net.teardown` kills every
process in every namespace of the run and deletes the namespaces (their veths and the bridge go
with them).

``python -m tests.netns agent`` is the process an :class:`Agent` starts inside a namespace: it runs
functions named ``module:function`` with JSON arguments and answers in JSON, each call in a thread
of its own, so a test in the machine's own namespace can drive Ray and HTTP from inside one.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from prerender_ray.processes import pid_alive

PREFIX = "prns"
SUBNET = "10.77.0"
TMP = Path("/tmp")  # short: Ray's unix socket paths have a length limit
IP_DEADLINE_S = 15.0


class NetError(RuntimeError):
    """An ``ip`` command failed; the message has its stderr."""


def run(cmd: list[str], *, timeout: float = IP_DEADLINE_S, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can): not Linux, not root, no ``ip``, or the
    kernel refuses a namespace, a bridge or a veth pair (EPERM in a container without CAP_SYS_ADMIN)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        r = run(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return f"cannot create a network namespace (`ip netns add`): {r.stderr.strip()}"
        for cmd in (["link", "add", "br0", "type", "bridge"], ["link", "add", "v0", "type", "veth", "peer", "name", "v1"]):
            r = run(["ip", "-n", probe, *cmd], check=False)
            if r.returncode != 0:
                return f"cannot make a {cmd[-1] if cmd[-1] == 'bridge' else 'veth pair'} in a namespace: {r.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run `ip`: {e!r}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def namespaces() -> list[str]:
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    r = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def kill_all(ns: str, sig: int = signal.SIGKILL, *, spare: frozenset[int] | set[int] = frozenset(),
             wait_s: float = 10.0) -> list[int]:
    """Send ``sig`` to every process in ``ns`` but ``spare``; with SIGKILL, wait until they are gone."""
    killed = [p for p in pids_in(ns) if p not in spare]
    for pid in killed:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    if sig == signal.SIGKILL:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(pid_alive(p) for p in killed):
            time.sleep(0.05)
    return killed


def _remove_ns(ns: str) -> None:
    for _ in range(3):  # a process may fork while we kill: go again until none is left
        if not kill_all(ns):
            break
    run(["ip", "netns", "del", ns], check=False)


def _owner(name: str) -> int | None:
    parts = name.split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[0] == PREFIX and parts[1].isdigit() else None


def remove_leftovers() -> list[str]:
    """Namespaces and temp dirs of earlier runs whose process is gone (a crash, a SIGKILL of pytest):
    their processes are killed and they are deleted. A run still alive keeps its own."""
    removed = []
    for ns in namespaces():
        pid = _owner(ns)
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            _remove_ns(ns)
            removed.append(ns)
    for path in TMP.glob(f"{PREFIX}-*"):
        pid = _owner(path.name + "-x")
        if pid is not None and pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class Net:
    """Hosts ``names`` on one switch, at 10.77.0.2, .3, ... in that order."""

    def __init__(self, names: list[str]):
        self.tag = f"{PREFIX}-{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.addr = {name: f"{SUBNET}.{i + 2}" for i, name in enumerate(names)}
        self.made: list[str] = []  # namespaces, in the order made
        self.tmp = TMP / self.tag

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def _veth(self, name: str) -> str:
        return f"v-{name}"[:15]

    def _add_ns(self, ns: str) -> None:
        run(["ip", "netns", "add", ns])
        self.made.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def up(self) -> Net:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._add_ns(self.switch)
        sw = ["ip", "-n", self.switch]
        run([*sw, "link", "add", "br0", "type", "bridge"])
        run([*sw, "link", "set", "br0", "up"])
        for name, addr in self.addr.items():
            ns = self.ns(name)
            self._add_ns(ns)
            run([*sw, "link", "add", self._veth(name), "type", "veth", "peer", "name", "eth0", "netns", ns])
            run([*sw, "link", "set", self._veth(name), "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        return self

    def cut(self, name: str) -> None:
        """Pull ``name``'s cable: the switch's end of its veth goes down."""
        run(["ip", "-n", self.switch, "link", "set", self._veth(name), "down"])

    def mend(self, name: str) -> None:
        run(["ip", "-n", self.switch, "link", "set", self._veth(name), "up"])

    def link_up(self, name: str) -> bool:
        out = run(["ip", "-n", self.switch, "-o", "link", "show", self._veth(name)]).stdout
        return "state UP" in out or ",UP" in out.split(">")[0]

    def pids(self, name: str) -> list[int]:
        return pids_in(self.ns(name))

    def kill(self, name: str, sig: int = signal.SIGKILL, *, spare: frozenset[int] | set[int] = frozenset()) -> list[int]:
        return kill_all(self.ns(name), sig, spare=spare)

    def exec_cmd(self, name: str, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(name), *cmd]

    def run_in(self, name: str, cmd: list[str], *, timeout: float, **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run(["timeout", "-s", "KILL", str(int(timeout)), *self.exec_cmd(name, cmd)],
                              capture_output=True, text=True, timeout=timeout + 5, **kw)

    def teardown(self) -> None:
        """Every process of every namespace of the run killed, the namespaces deleted (with their veths
        and the bridge), the temp dir removed. Safe to call twice and after a failed :meth:`up`."""
        for ns in reversed(self.made):
            _remove_ns(ns)
        self.made.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- Ray


def ray_env(token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every Ray process and driver of a run: its own token, no usage stats, the
    repository first on the path (so Ray workers import this checkout). Multi-node stays enabled:
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which the suite sets to keep its own Ray on loopback,
    makes ``ray start --address`` refuse to join a head on Linux too and a driver pick 127.0.0.1."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "PRERENDER_")) and k not in ("PYTHONPATH",)}
    repo = str(Path(__file__).resolve().parents[1])
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1",
               RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=repo, PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def ray_start(net: Net, name: str, *, env: dict[str, str], temp_dir: Path, head: str | None = None,
              labels: dict[str, str] | None = None, system_config: dict | None = None, num_cpus: int = 1,
              object_store_mb: int = 100, timeout: float = 90.0) -> None:
    """``ray start`` inside ``name``'s namespace on its address: the head when ``head`` is None, else a
    node joining the head at ``head`` (host:port). Its daemons stay in the namespace after it returns."""
    ray = str(Path(sys.executable).parent / "ray")
    cmd = [ray, "start", f"--node-ip-address={net.addr[name]}", f"--num-cpus={num_cpus}",
           f"--object-store-memory={object_store_mb * 1024 * 1024}", f"--temp-dir={temp_dir}",
           "--disable-usage-stats", "--include-log-monitor=false"]  # nothing reads worker output here
    if labels:
        cmd.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    if head is None:
        cmd += ["--head", "--port=6379", "--include-dashboard=false", "--no-monitor"]  # no autoscaler
        if system_config:
            cmd.append(f"--system-config={json.dumps(system_config)}")
    else:
        cmd.append(f"--address={head}")
    r = net.run_in(name, cmd, timeout=timeout, env=env, cwd=str(net.tmp))
    if r.returncode != 0:
        raise NetError(f"ray start on {name} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


# -------------------------------------------------------------------------------------------- agents


class AgentError(AssertionError):
    """A function run by an agent raised; the message carries its traceback."""


class Agent:
    """A Python process inside a namespace running functions on request (see the module docstring)."""

    def __init__(self, net: Net, name: str, *, env: dict[str, str], log: Path):
        self.name = name
        self._log: IO[bytes] = open(log, "ab")
        self.proc = subprocess.Popen(
            net.exec_cmd(name, [sys.executable, "-m", "tests.netns", "agent"]), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=str(Path(__file__).resolve().parents[1]))
        self._ids = itertools.count()
        self._waiting: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"agent-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                fut = self._waiting.pop(msg["id"], None)
            if fut is None:
                continue
            if msg["ok"]:
                fut.set_result(msg["value"])
            else:
                fut.set_exception(AgentError(f"on {self.name}: {msg['error']}"))
        with self._lock:  # the agent is gone: nobody answers the rest
            waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            fut.set_exception(AgentError(f"the agent on {self.name} exited (code {self.proc.poll()})"))

    def submit(self, fn: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            n = next(self._ids)
            self._waiting[n] = fut
            line = json.dumps({"id": n, "fn": fn, "args": args, "kwargs": kwargs}) + "\n"
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (OSError, ValueError) as e:
                self._waiting.pop(n, None)
                fut.set_exception(AgentError(f"the agent on {self.name} is gone: {e!r}"))
        return fut

    def call(self, fn: str, *args: Any, timeout: float = 60.0, **kwargs: Any) -> Any:
        return result(self.submit(fn, *args, **kwargs), timeout, f"{fn} on {self.name}")

    def close(self, timeout: float = 5.0) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout)
        finally:
            self._log.close()


def result(fut: concurrent.futures.Future, timeout: float, what: str) -> Any:
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"{what}: no answer within {timeout:g}s") from None


def _serve() -> None:
    """The agent's side: requests on stdin, answers on the original stdout (anything else a function
    prints goes to stderr, the agent's log)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    lock = threading.Lock()

    def handle(req: dict) -> None:
        try:
            module, name = req["fn"].split(":")
            value = getattr(importlib.import_module(module), name)(*req["args"], **req["kwargs"])
            answer = {"id": req["id"], "ok": True, "value": value}
        except BaseException:
            answer = {"id": req["id"], "ok": False, "error": traceback.format_exc()}
        text = json.dumps(answer, default=repr)
        with lock:
            out.write(text + "\n")

    for line in sys.stdin:
        threading.Thread(target=handle, args=(json.loads(line),), daemon=True).start()
    os._exit(0)  # stdin closed: the test is done with us (no Ray shutdown to wait for)


if __name__ == "__main__" and sys.argv[1:] == ["agent"]:
    _serve()
