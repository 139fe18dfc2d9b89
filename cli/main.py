"""The ``prerender-ray`` command: up, status, down, config, render."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import yaml

from prerender_ray import logs
from prerender_ray.actors import deploy
from prerender_ray.config import loading
from prerender_ray.config.model import Config
from prerender_ray.storage.rocks import StoreError, check_writable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _err(msg: str) -> None:
    print(f"prerender-ray: {msg}", file=sys.stderr)


def self_command(argv0: str | None = None) -> str:
    """This command as the shell it runs in can start it again: ``prerender-ray`` when PATH finds this
    very script, else its path (relative when under the working directory, e.g. a venv's
    ``.venv/bin/prerender-ray``), or ``python -m`` when it runs as a module."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    me = Path(argv0).absolute()
    if me.name != "prerender-ray":
        return f"{shlex.quote(sys.executable)} -m prerender_ray.cli.main"
    found = shutil.which("prerender-ray")
    if found and Path(found).absolute() == me:
        return "prerender-ray"
    try:
        rel = str(me.relative_to(Path.cwd()))
    except ValueError:
        return shlex.quote(str(me))
    return shlex.quote(rel if "/" in rel else f"./{rel}")  # a bare name would be looked up on PATH


def _data_dir(arg: str | None, cfg: Config | None = None) -> Path:
    return Path(arg or (cfg.server.data_dir if cfg else "./data")).expanduser().resolve()


def _load_config(args: argparse.Namespace) -> loading.Loaded:
    loaded = loading.load(args.config)
    overrides = {}
    if args.port is not None:
        overrides["port"] = args.port
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    if overrides:
        data = loaded.config.model_dump()
        data["server"].update(overrides)
        try:
            loaded.config = Config.model_validate(data)
        except Exception as e:
            raise loading.ConfigError([f"command line: {e}"]) from None
    return loaded


# -------------------------------------------------------------------------------------------- up


def cmd_up(args: argparse.Namespace) -> int:
    try:
        loaded = _load_config(args)
    except loading.ConfigError as e:
        for p in e.problems:
            _err(p)
        return EXIT_USAGE
    cfg = loaded.config
    data_dir = _data_dir(args.data_dir, cfg)
    try:
        check_writable(data_dir)
    except StoreError as e:
        _err(str(e))
        return EXIT_USAGE
    data = deploy.actor_config(cfg, data_dir)
    for w in loaded.warnings:
        _err(f"config: {w}")
    for f in loaded.findings:
        _err(f"config {f}")

    existing = deploy.Record.read(data_dir)
    if existing and existing.owns_ray and deploy.our_processes(existing):
        _err(f"a deployment is already running from {data_dir}; run `prerender-ray down --data-dir {data_dir}`")
        return EXIT_FAIL
    epoch = time.strftime("%Y%m%dT%H%M%S")
    if args.address is None and not deploy.port_free(cfg.server.host, cfg.server.port):
        _err(f"port {cfg.server.port} on {cfg.server.host} is already in use")
        return EXIT_FAIL
    record: deploy.Record | None = None
    placed = False
    try:
        if args.address is None:
            print(f"starting a local Ray for {data_dir} ...", flush=True)
            record = deploy.start_local_ray(data_dir, epoch, note=lambda m: print(m, flush=True))
        else:
            record = deploy.Record(address=args.address, owns_ray=False, epoch=epoch, started_at=time.time())
        record.write(data_dir)
        deploy.apply_env(record)
        if not args.detach:
            _print_logs(data_dir)
        deploy.connect(record.address)
        controller = deploy.place_controller(data, data_dir, epoch)
        placed = True
        status = deploy.wait_ready(controller, args.timeout)
    except deploy.DeployError as e:
        _err(str(e))
        _teardown(record, data_dir, quiet=True, stop_controller=placed, drain=False)
        return EXIT_FAIL
    for node in status["nodes"]:
        print(f"{node['name']}: {node['url']}  (bots: {node['url']}{cfg.ingress.bot_path_prefix}<url>)")
    print(f"console: {status['nodes'][0]['url']}/prerender_admin/  logs: {data_dir}/nodes/*/logs/ "
          f"(`{self_command()} logs --data-dir {shlex.quote(str(data_dir))}`)", flush=True)
    print("ready", flush=True)
    if args.detach:
        if args.with_worker:
            _err("--with-worker needs the foreground; start `prerender-ray render --queue URL` yourself")
        return EXIT_OK
    worker = None
    if args.with_worker:
        from prerender_ray.worker.supervise import start_worker

        worker = start_worker(cfg, status["nodes"][0]["url"])
    ended = _wait_for_end(record, data_dir)
    print("stopping ..." if ended is None else ended, flush=True)
    again = _second_signal() if ended is None else None
    drained = False
    if ended is None:
        period = cfg.fleet.drain_period / 1000
        print(f"draining: the queue says paused; results for granted jobs are taken for up to {period:g}s "
              "(Ctrl-C again to stop at once) ...", flush=True)
        if worker is not None:  # it renders what it holds while the node still takes results
            _print_drain(deploy.drain_deployment(controller, again))
            drained = True
    if worker is not None:
        from prerender_ray.worker.supervise import stop_worker

        stop_worker(worker)
    if ended is None:
        _teardown(record, data_dir, drain=not drained, abort=again)
        return EXIT_OK
    if ended == DOWN_ELSEWHERE:
        _leave(EXIT_OK)
    deploy.stop_local_ray(record)  # what the Ray that died left running
    (data_dir / deploy.RECORD).unlink(missing_ok=True)
    print("stopped", flush=True)
    _leave(EXIT_FAIL)


DOWN_ELSEWHERE = "stopped by `prerender-ray down`"
RAY_EXITED = "the local Ray exited unexpectedly; stopping"


def _wait_for_end(record: deploy.Record, data_dir: Path) -> str | None:
    """Until Ctrl-C or SIGTERM (None), or until the deployment ends without us: `down` from another
    shell marks the record stopping before it stops anything (and removes it last, after the local
    Ray), or the local Ray this `up` started has died."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        current = deploy.Record.read(data_dir)
        ray_alive = not record.owns_ray or deploy.local_ray_alive(record)
        if current is None and record.owns_ray and ray_alive:
            record.write(data_dir)  # removed by hand while our Ray runs: `status` and `down` need it
            continue
        if current is None or current.stopping or current.epoch != record.epoch:
            return DOWN_ELSEWHERE
        if not ray_alive:
            return RAY_EXITED
    return None


def _second_signal() -> threading.Event:
    """Set by a further Ctrl-C or SIGTERM while stopping: the drain is skipped."""
    again = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: again.set())
    return again


def _print_drain(report: dict) -> None:
    for line in deploy.describe_drain(report):
        print(line, flush=True)


def _leave(code: int) -> NoReturn:
    """Exit without touching Ray: it is stopping (or gone) under us, and any call into it, even
    ``ray.shutdown()`` at exit, can block until its 60 s GCS reconnect timeout, which then aborts
    the process with an error."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _teardown(record: deploy.Record | None, data_dir: Path, *, quiet: bool = False,
              stop_controller: bool = True, drain: bool = True, abort: threading.Event | None = None) -> None:
    """Drain and stop the deployment's actors (unless told not to), then the local Ray if ``up``
    started it."""
    import ray

    if ray.is_initialized() and stop_controller:
        controller = deploy.find_controller()
        if controller is not None:
            result = deploy.stop_deployment(controller, drain=drain, abort=abort)
            if "drain" in result and not quiet:
                _print_drain(result["drain"])
    if ray.is_initialized():
        ray.shutdown()
    if record is not None and record.owns_ray:
        deploy.stop_local_ray(record)
    if record is not None and (stop_controller or record.owns_ray):
        (data_dir / deploy.RECORD).unlink(missing_ok=True)
    if not quiet:
        print("stopped", flush=True)


# ---------------------------------------------------------------------------------- status / down


def _attach(args: argparse.Namespace) -> tuple[deploy.Record | None, str]:
    data_dir = _data_dir(args.data_dir)
    record = deploy.Record.read(data_dir)
    address = args.address or (record.address if record else None)
    if address is None:
        raise deploy.DeployError(f"no deployment recorded in {data_dir} (pass --address or --data-dir)")
    deploy.apply_env(record if record and record.address == address else None)
    return record, address


def cmd_status(args: argparse.Namespace) -> int:
    try:
        _, address = _attach(args)
        deploy.connect(address)
        controller = deploy.find_controller()
        if controller is None:
            raise deploy.DeployError("prerender-ray is not running on this cluster")
        status = deploy.controller_status(controller)
    except deploy.DeployError as e:
        if args.json:
            print(json.dumps({"healthy": False, "error": str(e), "nodes": []}))
        else:
            _err(str(e))
        return EXIT_FAIL
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        for n in status["nodes"]:
            k = n["keeper"]
            print(f"{n['name']:<20} {n['url']:<28} keeper={k['state']}({k['rows']} rows) "
                  f"leases={n['leasesInFlight']} ingress={n['ingressReplicas']['up']}/"
                  f"{n['ingressReplicas']['configured']} queue={n['queueStatus']} "
                  f"{'healthy' if n['healthy'] else 'UNHEALTHY ' + '; '.join(n['errors'])}")
    return EXIT_OK if status["healthy"] else EXIT_FAIL


def cmd_down(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args.data_dir)
    try:
        record, address = _attach(args)
    except deploy.DeployError as e:
        _err(str(e))
        return EXIT_FAIL
    try:
        deploy.connect(address)
    except deploy.DeployError as e:
        if not (record and record.owns_ray):
            _err(str(e))
            return EXIT_FAIL
        _err(f"{e}; stopping the local Ray anyway")
    ours = record if record and record.address == address else None
    if ours is not None:  # tell a foreground `up` before its Ray goes
        ours.stopping = True
        with contextlib.suppress(OSError):
            ours.write(data_dir)
    import ray

    if ray.is_initialized():
        print("draining: the queue says paused; results for granted jobs are taken for up to "
              "fleet.drainPeriod (Ctrl-C to stop at once) ...", flush=True)
    _teardown(ours, data_dir, abort=_second_signal())
    return EXIT_OK


# ---------------------------------------------------------------------------------------- config


def cmd_config_check(args: argparse.Namespace) -> int:
    try:
        loaded = loading.load(args.file)
    except loading.ConfigError as e:
        for p in e.problems:
            _err(p)
        return EXIT_FAIL
    for w in loaded.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for f in loaded.findings:
        print(f"{f}", file=sys.stderr)
    for line in loading.explain_domains(loaded.config):
        print(line, file=sys.stderr)
    for line in loading.explain_discovery(loaded.config):
        print(line, file=sys.stderr)
    if args.robots:
        from prerender_ray.sitemaps.robots import check_file

        try:
            with open(args.robots, "rb") as saved:
                body = saved.read(loaded.config.robots.max_bytes + 1)  # the cut needs to see one byte more
        except OSError as e:
            _err(f"--robots {args.robots}: {e.strerror or e}")
            return EXIT_FAIL
        for line in check_file(loaded.config, body, args.robots):
            print(line, file=sys.stderr)
    print(yaml.safe_dump(loading.redact(loaded.config), sort_keys=False), end="")
    return EXIT_OK


def cmd_config_defaults(args: argparse.Namespace) -> int:
    print(yaml.safe_dump(Config().model_dump(mode="json", by_alias=args.camel), sort_keys=False), end="")
    return EXIT_OK


def cmd_hash_password(args: argparse.Namespace) -> int:
    from prerender_ray.admin.users import hash_password

    password = sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else _prompt()
    if not password:
        _err("empty password")
        return EXIT_USAGE
    print(hash_password(password))
    return EXIT_OK


def _prompt() -> str:
    import getpass

    return getpass.getpass("password: ")


def _print_logs(data_dir: Path) -> None:
    """The foreground `up` prints every process's lines of this run as they are written: JSON lines
    when stdout is not a terminal, a compact rendering on one."""
    tty = sys.stdout.isatty()

    def pump() -> None:
        for line in logs.follow(lambda: logs.log_files(data_dir)):
            print(logs.pretty(line) if tty else line, flush=True)

    threading.Thread(target=pump, name="logs", daemon=True).start()


# ------------------------------------------------------------------------------------------ logs


def cmd_logs(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args.data_dir)
    files = logs.log_files(data_dir, args.node)
    if not files and not args.follow:
        _err(f"no logs under {data_dir} (nodes/*/logs/, logs/)" + (f" for node {args.node}" if args.node else ""))
        return EXIT_FAIL
    tty = sys.stdout.isatty()
    show = logs.pretty if tty and not args.json else (lambda line: line)
    try:
        for line in logs.read_lines(files, args.lines):
            print(show(line), flush=True)
        if args.follow:
            for line in logs.follow(lambda: logs.log_files(data_dir, args.node)):
                print(show(line), flush=True)
    except BrokenPipeError:
        pass
    return EXIT_OK


# ---------------------------------------------------------------------------------------- render


def cmd_render(args: argparse.Namespace) -> int:
    from prerender_ray.worker.main import main as render_main

    return render_main(args)


# ------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prerender-ray", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def where(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--data-dir", help="deployment data directory (default ./data)")
        sp.add_argument("--address", help="Ray cluster address (`auto` for the current `ray up` cluster)")

    up = sub.add_parser("up", help="start prerender-ray (a local Ray unless --address is given)")
    up.add_argument("--config", help=f"YAML config file (default ${loading.CONFIG_ENV} or built-in defaults)")
    up.add_argument("--port", type=int, help="ingress port (overrides server.port)")
    where(up)
    up.add_argument("--detach", action="store_true", help="return once every node is ready")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    up.add_argument("--with-worker", action="store_true",
                    help="also run a render worker (Chromium) against this node, stopped with it")
    up.set_defaults(func=cmd_up)

    st = sub.add_parser("status", help="per-node health; exit 1 when a node is unhealthy")
    where(st)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    dn = sub.add_parser("down", help="stop everything `up` started")
    where(dn)
    dn.set_defaults(func=cmd_down)

    lg = sub.add_parser("logs", help="every process's log lines (JSON lines), merged in time order")
    lg.add_argument("--data-dir", help="deployment data directory (default ./data)")
    lg.add_argument("--node", help="one node's lines only (`controller` for the controller's)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    lg.add_argument("--lines", "-n", type=int, help="only the last N lines")
    lg.add_argument("--json", action="store_true", help="JSON lines even on a terminal")
    lg.set_defaults(func=cmd_logs)

    cfg = sub.add_parser("config", help="validate or print configuration")
    csub = cfg.add_subparsers(dest="config_cmd", required=True)
    chk = csub.add_parser("check", help="validate FILE and print the effective config (secrets redacted)")
    chk.add_argument("file")
    chk.add_argument("--robots", metavar="ROBOTS_TXT",
                     help="also warn where the config serves a bot that this robots.txt file disallows "
                          "(a local file: config check never fetches)")
    chk.set_defaults(func=cmd_config_check)
    dfl = csub.add_parser("defaults", help="print the full default config as YAML")
    dfl.add_argument("--camel", action="store_true", help="use the reference's camelCase names")
    dfl.set_defaults(func=cmd_config_defaults)
    hp = csub.add_parser("hash-password", help="hash a password (read from stdin) for auth.users[].passwordHash")
    hp.set_defaults(func=cmd_hash_password)

    from prerender_ray.worker.options import add_arguments as render_arguments

    rn = sub.add_parser("render", help="run a render worker: claim jobs, render them in Chromium, post the HTML")
    render_arguments(rn)
    rn.set_defaults(func=cmd_render)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
