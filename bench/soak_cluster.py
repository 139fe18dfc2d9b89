"""Soak (issues 25, 36): three nodes, each a network namespace of its own (tests/netns.py, as the
namespace cluster tests build them), under mixed traffic for ``--minutes`` with a fault every
``--fault-every`` seconds, the kinds in a seeded random order (``--seed``; each round of faults is a
shuffle of ``--faults``):

- ``actor``: one actor (a keeper, a store, a lease table or an ingress replica of a random node) is
  killed with ``ray.kill`` as a crash is; the controller places it again.
- ``node-kill``: every process of node-b or node-c (raylet, workers) is killed with SIGKILL; once
  Ray has declared it dead and 5 s more, it is started again with the same name and data dir.
- ``cut``: node-b's or node-c's cable is pulled until Ray has declared it dead and the controller
  has pushed the two-node membership, and 3 s more; then it is put back. Its raylet exits once it
  reaches the GCS ("marked as dead") and it is started again, as the partition test does.
- ``head-cut``: node-a (Ray's GCS and our controller) is cut off from both others for
  ``--head-cut`` seconds, then put back: the controller is the minority. Every second the driver's
  view is printed when it changes: which nodes Ray says are alive, the controller's membership and
  its epoch, and whose raylet still runs. A node whose raylet exited (or that Ray declared dead) is
  started again.

Run (root, Linux): ``.venv/bin/python bench/soak_cluster.py [--minutes 30] [--fault-every 180]
[--replicas 2] [--faults actor,node-kill,cut,head-cut] [--head-cut 5] [--seed 7]``

Traffic, all along, from two places: from inside node-a's namespace to every node, and from inside
node-b's (an observer that sees what node-b and node-c serve while node-a is cut off): bot GETs of
cached pages (both devices), a fleet that claims jobs and posts a rendered page for each, target
writes of new URLs (due now, so the fleet renders them) and admin reads (``/readyz`` and ``GET
/render_targets``). Every grant goes into one ledger.

Printed: per fault, its kind, when, how long until the cluster was healthy again (the controller's
membership is the three nodes, each healthy) and until everything was in place again (every seeded
target, page and row on its holders); the answers that were not a success, grouped by the fault
they followed, the side that sent them and what they were, with their time windows relative to that
fault; the counts of each kind of traffic; the RSS of every process of every node at the start and
at the end; and a final check, once the traffic has stopped, that every target written (seeded and
acknowledged during the soak) is readable on every node, every seeded page is served from the cache
on every node, every key's schedule row is on exactly its owner, and no key was granted while a
lease on it was live (unless Ray declared the granting node dead in between).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import netns  # noqa: E402
from tests.actors import test_netns_cluster as T  # noqa: E402

KINDS = (("keeper", None), ("store", None), ("leases", None), ("ingress", 0))
FAULTS = ("actor", "node-kill", "cut", "head-cut")
THREE = [T.NODE[h] for h in T.HOSTS]
HEALTHY_S = 240.0  # a node started again is healthy within ~35 s on an idle machine; this one is shared
SETTLED_S = 240.0


def drv_view(health: bool = True) -> dict:
    """The driver's view (inside node-a, with the GCS): Ray's alive nodes, the controller's membership
    and its epoch, and (``health``: a status round that waits up to 10 s for a node that does not
    answer) each node's health."""
    import ray

    alive = T.drv_alive()
    try:
        d = T._STATE["d"]
        wire = ray.get(d.controller.handle.membership_wire.remote(), timeout=5)
        ctl: Any = {"members": sorted(n["name"] for n in wire["nodes"]), "epoch": wire["epoch"]}
        if health:
            ctl["healthy"] = {n["name"]: n["healthy"] for n in d.refresh()["nodes"]}
    except Exception as e:
        ctl = f"controller: {type(e).__name__}: {e}"[:200]
    return {"alive": alive, "controller": ctl}


def healthy(v: dict) -> bool:
    """The controller's membership is the three nodes, each healthy, and Ray says each is alive."""
    ctl = v.get("controller")
    return isinstance(ctl, dict) and ctl["members"] == THREE and all(ctl.get("healthy", {}).get(n) for n in THREE) \
        and all((v.get("alive") or {}).get(n) for n in THREE)


def rss(c: T.Cluster) -> dict[str, list[tuple[int, str]]]:
    """Per host: (RSS in MB, program) of every process in its namespace."""
    out: dict[str, list[tuple[int, str]]] = {}
    for h in T.HOSTS:
        rows = []
        for pid in c.net.pids(h):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
                name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except (OSError, StopIteration):
                continue
            rows.append((kb // 1024, name.rsplit("/", 1)[-1][:40]))
        out[T.NODE[h]] = sorted(rows, reverse=True)
    return out


def print_rss(title: str, table: dict[str, list[tuple[int, str]]]) -> None:
    print(f"\n{title}")
    for node, rows in table.items():
        print(f"  {node}: {sum(mb for mb, _ in rows)} MB in {len(rows)} processes: "
              + ", ".join(f"{name} {mb}" for mb, name in rows))


class Soak:
    def __init__(self, c: T.Cluster, args: argparse.Namespace, observer: netns.Agent):
        self.c, self.args, self.observer = c, args, observer
        self.rnd = random.Random(args.seed)
        self.t0 = T.now_ms()
        self.faults: list[dict] = []  # {"kind", "what", "t", "healthy", "settled", "notes"}
        self.order: list[str] = []

    def rel(self, t: int) -> str:
        return f"+{(t - self.t0) / 1000:.1f} s"

    def say(self, msg: str) -> None:
        print(f"{self.rel(T.now_ms())} {msg}", flush=True)

    def spare(self, host: str) -> set[int]:
        """The observer agent lives in node-b's namespace: a node kill is of the node's Ray, not of it."""
        return {self.observer.proc.pid} if host == "b" else set()

    def next_kind(self) -> str:
        if not self.order:
            self.order = list(self.args.faults)
            self.rnd.shuffle(self.order)
        return self.order.pop(0)

    def view(self, health: bool = True) -> dict:
        try:
            v = self.c.driver.call("bench.soak_cluster:drv_view", health, timeout=30)
        except AssertionError as e:
            v = {"error": str(e)[:200]}
        v["raylets"] = {T.NODE[h]: T.running(self.c.net, h, b"raylet") for h in T.HOSTS}
        return v

    def watch(self, seconds: float, fault: dict, stop: Any = None, health: bool = True) -> dict:
        """Sample the driver's view every second for ``seconds`` (or until ``stop(view)``), print each
        change, note deaths Ray declares. The last view."""
        deadline, last, v = time.monotonic() + seconds, None, {}
        while time.monotonic() < deadline:
            v = self.view(health)
            shown = {k: v.get(k) for k in ("alive", "controller", "raylets", "error")}
            if shown != last:
                self.say(f"  view: {shown}")
                fault["notes"].append((T.now_ms() - fault["t"], shown))
                last = shown
            for node, up in (v.get("alive") or {}).items():
                if not up and not self.c.deaths.get(node, [0])[-1] >= fault["t"]:
                    self.c.deaths.setdefault(node, []).append(T.now_ms())
            if stop and stop(v):
                break
            time.sleep(1.0)
        return v

    def restart(self, host: str) -> None:
        self.c.net.kill(host, spare=self.spare(host))
        self.c.start_ray(host)

    def recover(self, fault: dict, since_heal: int) -> None:
        """Start again a non-head node whose raylet is gone, or that Ray declared dead and whose raylet
        has not exited 60 s after the heal; then wait for the three-node membership, each healthy."""
        deadline = time.monotonic() + HEALTHY_S
        while time.monotonic() < deadline:
            v = self.view()
            for h in ("b", "c"):
                node = T.NODE[h]
                gone = not v["raylets"][node]
                dead = (v.get("alive") or {}).get(node) is False
                if gone or (dead and T.now_ms() - since_heal > 60_000):
                    self.say(f"  {node}: raylet {'exited' if gone else 'still running though dead'}; starting it again")
                    fault["notes"].append((T.now_ms() - fault["t"], f"{node} started again"))
                    self.restart(h)
            if healthy(v):
                fault["healthy"] = T.now_ms()
                return
            time.sleep(1.0)
        fault["notes"].append((T.now_ms() - fault["t"], "NOT HEALTHY within deadline"))

    def settle(self, fault: dict) -> None:
        try:
            T.settle(self.c, T.HOSTS, T.URLS, timeout=SETTLED_S, r=self.args.replicas)
            fault["settled"] = T.now_ms()
        except AssertionError as e:
            fault["notes"].append((T.now_ms() - fault["t"], f"NOT SETTLED: {e}"[:600]))

    def fault(self, kind: str) -> dict:
        c = self.c
        f: dict[str, Any] = {"kind": kind, "t": T.now_ms(), "notes": []}
        self.faults.append(f)
        try:
            if kind == "actor":
                what, index = self.rnd.choice(KINDS)
                node = T.NODE[self.rnd.choice(T.HOSTS)]
                f["what"] = c.drv("drv_kill", what, node, index, timeout=30)
                self.say(f"fault {len(self.faults)}: killed {f['what']}")
                self.recover(f, f["t"])
            elif kind == "node-kill":
                h = self.rnd.choice(("b", "c"))
                n = len(c.net.kill(h, spare=self.spare(h)))
                f["what"] = f"{T.NODE[h]} ({n} processes)"
                self.say(f"fault {len(self.faults)}: SIGKILL of {f['what']}")
                c.wait_dead(T.NODE[h], 60)
                f["notes"].append((T.now_ms() - f["t"], f"{T.NODE[h]} declared dead"))
                time.sleep(5)
                c.start_ray(h)
                f["notes"].append((T.now_ms() - f["t"], f"{T.NODE[h]} started again"))
                self.recover(f, T.now_ms())
            elif kind == "cut":
                h = self.rnd.choice(("b", "c"))
                f["what"] = f"{T.NODE[h]} cut off"
                self.say(f"fault {len(self.faults)}: {f['what']}")
                c.net.cut(h)
                try:
                    c.wait_dead(T.NODE[h], 60)
                    f["notes"].append((T.now_ms() - f["t"], f"{T.NODE[h]} declared dead"))
                    c.wait_members([n for n in THREE if n != T.NODE[h]], 60)
                    f["notes"].append((T.now_ms() - f["t"], "two-node membership"))
                    time.sleep(3)
                finally:
                    c.net.mend(h)
                healed = T.now_ms()
                f["notes"].append((healed - f["t"], "healed"))
                try:
                    T.wait_until(lambda: not T.running(c.net, h, b"raylet"), 60, f"{T.NODE[h]}'s raylet to exit")
                    f["notes"].append((T.now_ms() - f["t"], f"{T.NODE[h]}'s raylet exited"))
                except AssertionError as e:
                    f["notes"].append((T.now_ms() - f["t"], str(e)))
                self.recover(f, healed)
            elif kind == "head-cut":
                f["what"] = f"node-a cut off for {self.args.head_cut:g} s"
                self.say(f"fault {len(self.faults)}: {f['what']}")
                mended: list[int] = []

                def mend() -> None:  # on time, however long a look at the cluster takes
                    c.net.mend("a")
                    mended.append(T.now_ms())

                c.net.cut("a")
                timer = threading.Timer(self.args.head_cut, mend)
                timer.start()
                try:  # the health round waits for the nodes cut off: membership and Ray's view only
                    self.watch(self.args.head_cut, f, stop=lambda v: bool(mended), health=False)
                finally:
                    timer.join(self.args.head_cut + 5)
                    if not mended:
                        timer.cancel()
                        mend()
                f["mended"] = mended[0]
                f["notes"].append((mended[0] - f["t"], "mended"))
                self.say(f"  mended at +{(mended[0] - f['t']) / 1000:.1f} s after the cut")
                # what Ray and the controller do by themselves, before anything is started again
                self.watch(self.args.head_watch, f, stop=lambda v: healthy(v) or not all(v["raylets"].values()))
                self.recover(f, mended[0])
        except Exception as e:  # a fault that could not be made or recovered from is a finding
            f["notes"].append((T.now_ms() - f["t"], f"FAILED: {e!r}"[:600]))
            self.say(f"  fault failed: {e!r}"[:600])
            self.recover(f, T.now_ms())
        if "healthy" in f:
            self.say(f"  healthy after {(f['healthy'] - f['t']) / 1000:.1f} s")
            self.settle(f)
            if "settled" in f:
                self.say(f"  everything in place after {(f['settled'] - f['t']) / 1000:.1f} s")
        return f

    def which(self, t: int) -> int:
        """The index of the fault a time follows (-1: before the first)."""
        i = -1
        for j, f in enumerate(self.faults):
            if f["t"] <= t:
                i = j
        return i

    def report(self, recs: dict[str, dict[str, list[dict]]]) -> None:
        print(f"\nsoak: {self.args.minutes:g} min on 3 namespace nodes, cluster.replicas {self.args.replicas}, "
              f"seed {self.args.seed}, a fault every {self.args.fault_every:g} s; faults:")
        for i, f in enumerate(self.faults):
            healthy = f"healthy after {(f['healthy'] - f['t']) / 1000:.1f} s" if "healthy" in f else "NEVER HEALTHY"
            settled = f"in place after {(f['settled'] - f['t']) / 1000:.1f} s" if "settled" in f else "NOT IN PLACE"
            print(f"  #{i + 1} {self.rel(f['t'])} {f['kind']}: {f.get('what')}; {healthy}, {settled}")
            for dt, note in f["notes"]:
                if not isinstance(note, dict):
                    print(f"      +{dt / 1000:.1f} s {note}")
        ok = {"bots": lambda r: r.get("status") == 200, "claims": lambda r: "error" not in r,
              "writes": lambda r: r.get("status") == 200,
              "reads": lambda r: r.get("ready") == 200 and r.get("target") == 200,
              "results": lambda r: r.get("status") == 204}
        print("\ntraffic (from node-a's namespace to every node, from node-b's to node-b and node-c):")
        spans: dict[tuple, list] = {}
        for src, rec in recs.items():
            for kind, good in ok.items():
                bad = [r for r in rec[kind] if not good(r)]
                print(f"  {src} {kind}: {len(rec[kind])} requests, {len(bad)} not a success")
                for r in bad:
                    what = r.get("error") or r.get("status") or (r.get("ready"), r.get("target"))
                    key = (self.which(r["t"]), kind, f"{src}->{r.get('node')}", str(what))
                    span = spans.setdefault(key, [r["t"], r["t"], 0, r])
                    span[1], span[2] = r["t"], span[2] + 1
        for i, f in enumerate(self.faults):
            if f["kind"] != "head-cut" or "mended" not in f:
                continue
            after = f.get("healthy", T.now_ms())
            print(f"\nhead cut #{i + 1}: what each side answered while node-a was cut off (0 to "
                  f"{(f['mended'] - f['t']) / 1000:.1f} s) and from then until healthy (to {(after - f['t']) / 1000:.1f} s)")
            for label, (a, b) in (("cut", (f["t"], f["mended"])), ("after", (f["mended"], after))):
                for src, rec in recs.items():
                    print(f"  {label} {src}: bots {T.summary(T.during(rec['bots'], a, b), 'node', 'status')}; "
                          f"grants {T.summary(T.during(rec['grants'], a, b), 'node')}; "
                          f"writes {T.summary(T.during(rec['writes'], a, b), 'node', 'status')}; "
                          f"reads {T.summary(T.during(rec['reads'], a, b), 'node', 'ready', 'target')}")
            grants = [g for rec in recs.values() for g in T.during(rec["grants"], f["t"], after)]
            sides: dict[str, set[str]] = {}
            for g in grants:
                sides.setdefault(g["key"], set()).add("a" if g["node"] == "node-a" else "bc")
            both = sorted(k for k, v in sides.items() if len(v) == 2)
            print(f"  keys granted on both sides between the cut and healthy: {len(both)} of {len(sides)}", both[:5])
        print("\nnot a success, by the fault they followed (times from that fault's start):")
        for key in sorted(spans):
            i, kind, path, what = key
            first, last, n, sample = spans[key]
            base = self.faults[i]["t"] if i >= 0 else self.t0
            label = f"after #{i + 1} {self.faults[i]['kind']}" if i >= 0 else "before any fault"
            print(f"  {label}: {kind} {path} {what}: {n} from +{(first - base) / 1000:.1f} s to "
                  f"+{(last - base) / 1000:.1f} s; e.g. {({k: v for k, v in sample.items() if k not in ('t', 'node')})}"[:400])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--fault-every", type=float, default=180)
    ap.add_argument("--faults", type=lambda s: s.split(","), default=list(FAULTS))
    ap.add_argument("--head-cut", type=float, default=5.0, help="seconds node-a is cut off")
    ap.add_argument("--head-watch", type=float, default=90.0,
                    help="seconds to watch, after a head cut heals, before starting dead nodes again")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    if set(args.faults) - set(FAULTS):
        sys.exit(f"unknown faults: {set(args.faults) - set(FAULTS)}; known: {FAULTS}")
    reason = netns.unavailable()
    if reason:
        sys.exit(f"soak skipped: network namespaces unavailable: {reason}")
    netns.remove_leftovers()
    root = Path(f"/tmp/soak-{int(time.time())}")
    root.mkdir(parents=True)
    print(f"logs: {root}", flush=True)
    env = netns.ray_env(secrets.token_hex(32), {T.FLEET_ENV: secrets.token_hex(16), T.ADMIN_ENV: secrets.token_hex(16)})
    c = T.Cluster(netns.Net(list(T.HOSTS)), env, root, root / "data")
    try:
        c.net.up()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            started = [pool.submit(c.start_ray, "a")]
            time.sleep(2)
            started += [pool.submit(c.start_ray, h) for h in ("b", "c")]
            for f in started:
                f.result()
        c.agent("a")
        placed = c.drv("drv_deploy", f"{c.net.addr['a']}:6379", str(c.data_dir),
                       {"cluster": {"replicas": args.replicas}}, timeout=200)
        assert placed["controller"] == "node-a", placed
        c.ledger += c.drv("drv_seed", c.bases(*T.HOSTS), timeout=120)
        T.settle(c, T.HOSTS, T.URLS, timeout=120, r=args.replicas)
        observer = c.agent("b")
        before = rss(c)
        everywhere, bc = c.bases(*T.HOSTS), c.bases("b", "c")
        common = {"answer": True, "limit": 10, "pause": 0.5, "timeout": 10.0}
        c.drv("probe_start", "soak", {"bots": everywhere, "claims": everywhere, "writes": everywhere,
                                      "reads": everywhere, "fresh": f"{T.SITE}/soak/", **common})
        observer.call(f"{T.__name__}:probe_start", "soak-b", {"bots": bc, "claims": bc, "writes": bc, "reads": bc,
                                                             "fresh": f"{T.SITE}/soak-b/", **common})
        s = Soak(c, args, observer)
        end = time.monotonic() + args.minutes * 60
        nxt = time.monotonic() + args.fault_every
        while nxt < end:
            time.sleep(max(0.0, nxt - time.monotonic()))
            start = time.monotonic()
            s.fault(s.next_kind())
            nxt = max(start + args.fault_every, time.monotonic() + 20)
        time.sleep(max(0.0, end - time.monotonic()))
        recs = {"from a": c.drv("probe_stop", "soak", timeout=120),
                "from b": netns.result(observer.submit(f"{T.__name__}:probe_stop", "soak-b"), 120, "probe_stop on b")}
        acked = [w["url"] for rec in recs.values() for w in rec["writes"] if w.get("status") == 200]
        for rec in recs.values():
            c.ledger += rec["grants"]
        s.report(recs)
        t_settle = time.monotonic()
        try:
            T.settle(c, T.HOSTS, T.URLS + acked, timeout=300, r=args.replicas)
            settled = f"settled in {time.monotonic() - t_settle:.1f} s"
        except AssertionError as e:
            settled = f"NOT SETTLED: {e}"
        doubles = T.double_grants(c.ledger, c.deaths)
        print_rss("RSS at the start (MB)", before)
        print_rss("RSS at the end (MB)", rss(c))
        print(f"\nRay declared dead: { {n: [s.rel(t) for t in ts] for n, ts in c.deaths.items()} }")
        print(f"final check: {len(T.URLS) + len(acked)} targets ({len(acked)} written during the soak), "
              f"{len(T.PAGED) * 2} seeded pages, {len(T.KEYS)} seeded schedule rows, {len(c.ledger)} grants: "
              f"{settled}; keys granted inside a live lease: {len(doubles)}", *doubles[:20], sep="\n", flush=True)
    finally:
        c.close()
        print(f"cleaned up; Ray's logs in {root}", flush=True)


if __name__ == "__main__":
    main()
