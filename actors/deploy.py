"""Driver-side deployment: start or join Ray, place the controller, wait for readiness, tear down.

A deployment is recorded in ``<data-dir>/deployment.json`` so that ``status`` and ``down`` find it
the same way ``up`` made it, and ``down`` stops only the Ray that ``up`` started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prerender_ray.actors.controller_client import ControllerClient
from prerender_ray.processes import pid_alive
from prerender_ray.rpc import DeadlineExceeded

RECORD = "deployment.json"
RAY_START_DEADLINE_S = 90.0
RAY_START_AGAIN_S = 20.0  # the least time left worth a second start (one takes 3-10 s)
STATUS_CALL_S = 45.0  # one status call; wait_ready keeps asking until its own deadline


class DeployError(RuntimeError):
    """Something an operator must fix; the message says what."""


class ControllerSilent(DeployError):
    """The controller did not answer in time (its worker may still be starting)."""


@dataclass
class Record:
    address: str
    owns_ray: bool
    epoch: str
    ray_pid: int | None = None
    temp_dir: str | None = None
    token_file: str | None = None
    started_at: float = 0.0
    stopping: bool = False  # set by `down` first, so a foreground `up` steps aside at once

    @classmethod
    def read(cls, data_dir: Path) -> Record | None:
        try:
            return cls(**json.loads((data_dir / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, data_dir: Path) -> None:
        tmp = data_dir / (RECORD + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(data_dir / RECORD)


def actor_config(cfg: Any, data_dir: Path) -> dict:
    """The config as it travels to the actors: the absolute data dir, passwords only as hashes."""
    from prerender_ray.admin.users import resolve_password_hashes

    data = cfg.model_dump()
    data["server"]["data_dir"] = str(data_dir)
    data["auth"]["users"] = resolve_password_hashes(cfg.auth)
    # One session-signing secret for the whole deployment: every replica of every node gets it with
    # the config, so a session made on one is honoured by all. Random unless the operator set one.
    data["auth"]["session_secret"] = cfg.auth.session_secret or secrets.token_urlsafe(32)
    return data


# ------------------------------------------------------------------------------------------- ports


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports: all are held open at once while the kernel picks them, so no two
    are the same (separate picks can return one port twice, and Ray then refuses to start)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


# -------------------------------------------------------------------------------------- local Ray


def _ray_env(token: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep the embedded node on loopback
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if token is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = token
        env.pop("RAY_AUTH_TOKEN_PATH", None)
    return env


def apply_env(record: Record | None) -> None:
    """Make this process speak to the deployment's Ray (its token, loopback)."""
    token = None
    if record and record.token_file:
        try:
            token = Path(record.token_file).read_text().strip()
        except OSError:
            raise DeployError(f"cannot read the Ray token {record.token_file}") from None
    if record and record.owns_ray:
        os.environ.update({k: v for k, v in _ray_env(token).items() if k.startswith("RAY_")})
        if token is None:
            os.environ.pop("RAY_AUTH_TOKEN", None)


def _token_file(ray_dir: Path) -> Path:
    """The deployment's Ray token, readable by its owner only: a new one is written 0600 from its first
    byte (a temp file renamed into place, so never a window at the umask's mode nor a half-written
    token), and one left with looser modes is tightened."""
    token_file = ray_dir / "auth_token"
    if token_file.exists():
        if os.stat(token_file).st_mode & 0o077:
            os.chmod(token_file, 0o600)
        return token_file
    tmp = ray_dir / f".auth_token.{os.getpid()}"
    tmp.unlink(missing_ok=True)  # left by a crashed start that had this pid
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.replace(tmp, token_file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return token_file


def start_local_ray(data_dir: Path, epoch: str, note: Callable[[str], None] = lambda _: None) -> Record:
    """Start a single-node Ray for this deployment: its own token, temp dir and ports, on loopback.
    ``ray start --block`` in a session of its own supervises the Ray processes; stopping it stops them.

    One start that fails the known way (see ``_agent_wait_aborted``) is made once more, inside the one
    deadline; ``note`` is told why."""
    ray_dir = data_dir / "ray"
    ray_dir.mkdir(parents=True, exist_ok=True)
    token_file = _token_file(ray_dir)
    # Unix socket paths are short: keep Ray's temp dir out of a possibly deep data dir.
    tag = hashlib.sha1(str(data_dir).encode()).hexdigest()[:10]
    temp_dir = Path("/tmp") / f"prerender-ray-{tag}"
    deadline = time.monotonic() + RAY_START_DEADLINE_S
    for attempt in (1, 2):
        proc = _ray_start(ray_dir, temp_dir, token_file)
        while time.monotonic() < deadline:
            if proc.poll() is not None or _agent_wait_aborted(temp_dir):
                break  # `ray start` itself notices a dead raylet only at its own 30 s deadline
            address = _cluster_address(temp_dir)
            if address:
                return Record(address=address, owns_ray=True, epoch=epoch, ray_pid=proc.pid, temp_dir=str(temp_dir),
                              token_file=str(token_file), started_at=time.time())
            time.sleep(0.2)
        else:
            _clear_start(proc, temp_dir)
            raise DeployError(f"Ray did not start within {RAY_START_DEADLINE_S:g}s; see {ray_dir / 'ray-start.log'}")
        _clear_start(proc, temp_dir)
        aborted = _agent_wait_aborted(temp_dir)
        if not (aborted and attempt == 1 and deadline - time.monotonic() > RAY_START_AGAIN_S):
            break
        note("Ray's raylet gave up waiting for its agents to start (a busy machine); starting Ray once more")
    why = "its raylet gave up waiting for its agents" if aborted else f"exit {proc.returncode}"
    raise DeployError(f"Ray did not start ({why}); see {ray_dir / 'ray-start.log'}")


def _ray_start(ray_dir: Path, temp_dir: Path, token_file: Path) -> subprocess.Popen:
    from prerender_ray.identity.nodes import RAY_SYSTEM_CONFIG

    (temp_dir / "ray_current_cluster").unlink(missing_ok=True)
    (temp_dir / "session_latest").unlink(missing_ok=True)  # names this start's session once it has one
    gcs, client, dashboard, agent, metrics = free_ports(5)
    cmd = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=1",
        "--object-store-memory=100000000", "--include-dashboard=false", "--disable-usage-stats",
        f"--temp-dir={temp_dir}", f"--ray-client-server-port={client}",
        f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}",
        f"--metrics-export-port={metrics}", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}",
    ]
    with open(ray_dir / "ray-start.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_ray_env(token_file.read_text().strip()), start_new_session=True,
                                cwd=str(ray_dir.parent))


def _cluster_address(temp_dir: Path) -> str:
    try:
        return (temp_dir / "ray_current_cluster").read_text().strip()
    except OSError:
        return ""


def _clear_start(proc: subprocess.Popen, temp_dir: Path) -> None:
    """What a failed start left: its session, and any process naming its temp dir."""
    _kill_group(proc.pid)
    for pid in _strays(str(temp_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _agent_wait_aborted(temp_dir: Path) -> bool:
    """Whether the start's raylet aborted on its wait for an agent. Ray 2.60's raylet gives its dashboard
    agent a fixed 15 s to report its ports (no setting, no flag: it waits for the port file even when
    the port is named) and aborts past it; an agent's imports on a busy machine can take longer."""
    try:
        tail = (temp_dir / "session_latest" / "logs" / "raylet.err").read_bytes()[-65536:]
    except OSError:
        return False
    return b"Timed out waiting for file" in tail


def stop_local_ray(record: Record, grace_s: float = 20.0) -> None:
    """SIGTERM the supervising ``ray start``; SIGKILL its session and strays after the grace.

    Strays are the processes naming the Ray temp dir and this deployment's Ray workers: when the Ray
    died rather than being stopped, its actors are still running (they notice the lost raylet only
    seconds later)."""
    if not record.ray_pid:
        return
    try:
        os.kill(record.ray_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(record.ray_pid):
        time.sleep(0.2)
    _kill_group(record.ray_pid)
    killed = _strays(record.temp_dir, workers_of=record)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0  # gone, with their ports, before we say stopped
    while time.monotonic() < deadline and any(pid_alive(p) for p in killed):
        time.sleep(0.05)
    _reap(record.ray_pid)


def local_ray_alive(record: Record) -> bool:
    return record.ray_pid is not None and record.ray_pid > 0 and pid_alive(record.ray_pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _token_mark(record: Record) -> bytes | None:
    """How this deployment's token appears in its Ray processes' environment."""
    try:
        token = Path(record.token_file).read_bytes().strip() if record.token_file else b""
    except OSError:
        return None
    return b"RAY_AUTH_TOKEN=" + token + b"\0" if token else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _strays(*marks: str | None, workers_of: Record | None = None) -> list[int]:
    """Processes that mention one of ``marks`` (this deployment's Ray temp dir or data dir) in their
    command line or environment: Ray workers leave the supervisor's process group. With
    ``workers_of``, also the Ray workers carrying that deployment's token: an actor renames its
    command line to ``ray::<Class>`` and only works in the data dir, so the token is the one mark
    every worker has."""
    needles = [m.encode() for m in marks if m]
    token = _token_mark(workers_of) if workers_of else None
    if not needles and token is None:
        return []
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(n in cmd or n in environ for n in needles) or (
                token is not None and cmd.startswith(b"ray::") and token in environ):
            found.append(int(proc.name))
    return [p for p in found if p != os.getpid()]


def our_processes(record: Record, data_dir: Path | None = None) -> list[int]:
    pids = set(_strays(record.temp_dir, str(data_dir) if data_dir else None, workers_of=record))
    if record.ray_pid is not None and local_ray_alive(record):
        pids.add(record.ray_pid)
    return sorted(pids)


# ------------------------------------------------------------------------------------ Ray session


def connect(address: str, *, log_to_driver: bool = False) -> None:
    import logging

    import ray

    from prerender_ray.identity.nodes import NAMESPACE

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=log_to_driver,
                 logging_level=logging.WARNING, configure_logging=True)
    except Exception as e:
        raise DeployError(f"cannot connect to Ray at {address}: {e}") from None
    if not log_to_driver:
        quiet_driver()


def quiet_driver() -> None:
    """No raw Ray lines on this process's output: ``log_to_driver=False`` stops the workers' logs,
    but a driver still prints the raylet's error messages, coloured (seen in CI: "(raylet) A worker
    died ..." in `up`'s JSON lines as it stopped the actors). Our own logs say what happened to the
    actors; this is the switch Ray's own debugger turns (``ray.util.rpdb``)."""
    import ray._private.worker as ray_worker

    if hasattr(ray_worker, "_worker_logs_enabled"):
        ray_worker._worker_logs_enabled = False


def find_controller() -> ControllerClient | None:
    return ControllerClient.find()


def place_controller(config: dict, data_dir: Path, epoch: str) -> ControllerClient:
    if find_controller() is not None:
        raise DeployError("prerender-ray is already running on this cluster; run `prerender-ray down` first")
    return ControllerClient.place(config, data_dir, epoch)


def controller_status(controller: ControllerClient, timeout: float = STATUS_CALL_S) -> dict:
    import ray

    try:
        return controller.status(timeout)
    except DeadlineExceeded as e:
        raise ControllerSilent(str(e)) from None
    except ray.exceptions.RayActorError:
        raise DeployError("the controller is gone (stopped by `prerender-ray down`?)") from None


def wait_ready(controller: ControllerClient, deadline_s: float, *, expect_nodes: int = 1) -> dict:
    """Wait until every placed node is healthy (all its ingress replicas up) and answers /readyz
    with 200; fail fast on a node's start error (a port in use)."""
    import httpx

    deadline = time.monotonic() + deadline_s
    last: dict = {}
    problem = "no node placed yet"
    while time.monotonic() < deadline:
        # The first answer waits for the controller's worker to start, which a busy machine can
        # stretch past one call's deadline: only the caller's deadline ends the wait.
        try:
            last = controller_status(controller, timeout=max(1.0, min(STATUS_CALL_S, deadline - time.monotonic())))
        except ControllerSilent as e:
            problem = str(e)
            continue
        errors = [f"{n['name']}: {e}" for n in last["nodes"] for e in n.get("errors", []) if "port" in e]
        if errors:
            raise DeployError("; ".join(errors))
        if len(last["nodes"]) >= expect_nodes:
            pending = [f"{n['name']}: {n['ingressReplicas']['up']}/{n['ingressReplicas']['configured']} "
                       f"ingress replicas up" for n in last["nodes"] if not n["healthy"]]
            for node in last["nodes"]:
                try:
                    r = httpx.get(f"{node['url']}/readyz", timeout=2.0, verify=False)
                    if r.status_code != 200:
                        pending.append(f"{node['name']}: {r.json().get('reason', r.status_code)}")
                except httpx.HTTPError as e:
                    pending.append(f"{node['name']}: {type(e).__name__}")
            if not pending:
                return last
            problem = "; ".join(pending)
        time.sleep(0.5)
    raise DeployError(f"not ready within {deadline_s:g}s: {problem}")


def drain_deployment(controller: ControllerClient, abort: threading.Event | None = None) -> dict:
    """Every node says paused and accepts the results of the leases it granted, for at most
    ``fleet.drainPeriod`` (``Controller.drain``); ``abort`` set (a second Ctrl-C) stops waiting."""
    try:
        report = controller.drain(abort.is_set if abort is not None else lambda: False)
    except DeadlineExceeded as e:
        return {"error": str(e)}
    except Exception as e:
        return {"error": repr(e)}
    return report if report is not None else {"error": "skipped by a second signal"}


def describe_drain(report: dict) -> list[str]:
    """One line per node of what a drain did, for the operator."""
    if "error" in report:
        return [f"drain: {report['error']}"]
    lines = []
    for n in report.get("nodes", []):
        if n.get("ended") == "drained":
            lines.append(f"{n['node']}: drained in {n['waitedMs'] / 1000:.1f}s (no result outstanding)")
        elif n.get("ended") == "deadline":
            lines.append(f"{n['node']}: drain period over with {n.get('awaitingResults')} result(s) outstanding "
                         "(their leases are kept: a result posted after the next start is still accepted)")
        else:
            lines.append(f"{n['node']}: drain failed: {n.get('error')}")
    return lines


def stop_deployment(controller: ControllerClient, timeout: float = 60.0, *, drain: bool = True,
                    abort: threading.Event | None = None) -> dict:
    """Drain (unless told not to), then stop every node's actors and the controller."""
    drained = drain_deployment(controller, abort) if drain else None
    try:
        result = controller.stop(timeout)
    except Exception as e:
        result = {"error": repr(e)}
    if drained is not None:
        result["drain"] = drained
    controller.kill()
    return result
