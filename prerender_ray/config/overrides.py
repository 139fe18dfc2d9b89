"""Live config overrides: the options an admin may change on a running cluster without a restart. Pure.

The config file is the base every process starts from. Overrides are one replicated registry row
(``o:config``) on top of it. Every node's keeper re-reads the row with its queue status (nudged by the
admin API after a write, and before it loads, so a restarted keeper comes back with them), every
ingress replica and sitemap walker every ``OVERRIDES_POLL_S``, and each applies a change in memory: the keeper reclassifies the rows it holds (a route's
cadence, the route list, the default interval, the sitemap boost) without reloading anything.

Only ``LIVE_PATHS`` may be overridden; every other option is read once at start (ports, stores,
cache keys, auth ...): change the file and restart. A write is all or nothing: every entry is checked,
and the resulting config is validated as a whole (and its routes compiled with nothing dropped)
before anything is written.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from prerender_ray.config.model import Config
from prerender_ray.identity.routes import Route, compile_routes

OVERRIDES_POLL_S = 5  # ingress replicas and sitemap walkers re-read the row this often
LIVE_PATHS = (
    "ingress.routes",
    "ingress.exclude_path_patterns",
    "render.default_interval",
    "queue.ready.sitemap_boost",
    # bot policies (prerender_ray.serving.bot_policy); bots.verify is read at start
    "bots.default",
    "bots.classes",
    "bots.named",
    "bots.deny_status",
    "bots.deny_body",
    "bots.failed_class",
)
MAX_ENTRIES = 200
NOTE_MAX = 200
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


class OverrideError(ValueError):
    """A request that names nothing to do, or an unreadable stored row."""


def snake_path(path: str) -> str:
    """``render.defaultInterval`` -> ``render.default_interval`` (either spelling is accepted)."""
    return ".".join(_CAMEL.sub("_", part).lower() for part in path.strip().split("."))


def camel_path(path: str) -> str:
    return ".".join(p.split("_")[0] + "".join(w.title() for w in p.split("_")[1:]) for p in path.split("."))


@dataclass(frozen=True)
class Overrides:
    """The stored row: ``values`` by snake path, each with who set it, when, and an optional note."""

    values: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, dict] = field(default_factory=dict)  # path -> {updatedBy, updatedTime, note}

    def encode(self) -> bytes:
        return json.dumps({"v": 1, "values": self.values, "meta": self.meta}, separators=(",", ":"),
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> Overrides:
        if not data:
            return cls()
        try:
            d = json.loads(data)
            values, meta = d["values"], d.get("meta", {})
            if not isinstance(values, dict) or not isinstance(meta, dict):
                raise TypeError("values and meta must be objects")
        except (ValueError, TypeError, KeyError) as e:
            raise OverrideError(f"unreadable config overrides row: {e}") from None
        return cls({k: v for k, v in values.items() if k in LIVE_PATHS}, meta)

    def rows(self) -> list[dict]:
        return [{"path": camel_path(p), "value": v, **self.meta.get(p, {})} for p, v in sorted(self.values.items())]


def _get(d: dict, path: str) -> Any:
    for part in path.split("."):
        d = d[part]
    return d


def _set(d: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        d = d[part]
    d[leaf] = value


def effective(base: Config, overrides: Overrides) -> Config:
    """``base`` with the overrides applied (raises ``ValidationError`` when they do not validate)."""
    if not overrides.values:
        return base
    data = base.model_dump()
    for path, value in overrides.values.items():
        if path in LIVE_PATHS:
            _set(data, path, copy.deepcopy(value))
    return Config.model_validate(data)


def live_values(cfg: Config) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    return {path: _get(data, path) for path in LIVE_PATHS}


@dataclass
class Plan:
    """What a write would do. ``invalid`` non-empty: nothing may be written."""

    overrides: Overrides
    config: Config | None
    changes: list[dict] = field(default_factory=list)
    noop: list[dict] = field(default_factory=list)
    invalid: list[dict] = field(default_factory=list)
    route_warnings: list[str] = field(default_factory=list)

    def body(self) -> dict:
        return {"changes": self.changes, "noop": self.noop, "invalid": self.invalid,
                "routes": {"warnings": self.route_warnings} if self.route_warnings else None,
                "overrides": self.overrides.rows()}


def plan(base: Config, current: Overrides, sets: Any, clears: Any, *, by: str, now: int) -> Plan:
    """Check a ``{set: [{path, value, note?}], clear: [path]}`` request against the base config and
    the stored overrides. Raises ``OverrideError`` for a request with nothing to do or the wrong shape."""
    sets = [] if sets is None else sets
    clears = [] if clears is None else clears
    if not isinstance(sets, list) or not isinstance(clears, list):
        raise OverrideError("set and clear must be arrays")
    if not sets and not clears:
        raise OverrideError("Nothing to do")
    if len(sets) + len(clears) > MAX_ENTRIES:
        raise OverrideError(f"at most {MAX_ENTRIES} entries per request")
    invalid: list[dict] = []
    values, meta = dict(current.values), dict(current.meta)
    seen: set[str] = set()
    for entry in sets:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or "value" not in entry:
            invalid.append({"path": entry.get("path") if isinstance(entry, dict) else None,
                            "reason": "each set entry is {path, value, note?}"})
            continue
        path = snake_path(entry["path"])
        note = entry.get("note")
        reason = _path_problem(path, seen)
        if reason is None and note is not None and (not isinstance(note, str) or len(note) > NOTE_MAX):
            reason = f"note must be a string of at most {NOTE_MAX} characters"
        if reason is not None:
            invalid.append({"path": entry["path"], "reason": reason})
            continue
        seen.add(path)
        values[path] = entry["value"]
        meta[path] = {"updatedBy": by, "updatedTime": now, **({"note": note} if note else {})}
    for path in clears:
        if not isinstance(path, str) or not path.strip():
            invalid.append({"path": path, "reason": "a clear entry is a non-empty path"})
            continue
        snake = snake_path(path)
        if snake in seen:
            invalid.append({"path": path, "reason": "set and cleared in one request"})
            continue
        seen.add(snake)
        values.pop(snake, None)
        meta.pop(snake, None)
    prospective = Overrides(values, meta)
    result = Plan(prospective, None, invalid=invalid)
    if invalid:
        return result
    try:
        cfg = effective(base, prospective)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            path = next((p for p in LIVE_PATHS if loc.startswith(p)), loc)
            invalid.append({"path": camel_path(path), "reason": f"{loc}: {err['msg'].removeprefix('Value error, ')}"})
        return result
    compiled = compile_routes(cfg)
    # The file's rule (drop a bad route or field with a warning) would silently change a live cluster
    # into something the admin did not ask for: refuse instead.
    refused = [*compiled.errors, *(w for w in compiled.warnings if "dropped" in w or "ignored" in w)]
    if refused:
        invalid.extend({"path": "ingress.routes", "reason": w} for w in refused)
        return result
    result.config = cfg
    was = effective(base, current)
    result.route_warnings = list(compiled.warnings) + _rekey_warnings(was, cfg, compiled.routes)
    before, after = live_values(was), live_values(cfg)
    for path in sorted(seen):
        item = {"path": camel_path(path), "from": before.get(path), "to": after.get(path)}
        (result.changes if before.get(path) != after.get(path) else result.noop).append(item)
    return result


def _rekey_warnings(was: Config, now: Config, new: Sequence[Route]) -> list[str]:
    """What a route change does beyond scheduling: in forwarded mode a route's queryParams are part of
    its URLs' cache keys (pages and rows under the old keys are not migrated), and a route's
    deviceTypes decide which devices new targets get. ``new``: ``now``'s compiled routes."""
    old = compile_routes(was).routes
    out = []
    if now.ingress.mode == "forwarded" and [(r.match, r.path, r.mode, r.query_params) for r in old] != \
            [(r.match, r.path, r.mode, r.query_params) for r in new]:
        out.append("ingress.routes: the query allowlist of some paths changes, and with it their cache keys; "
                   "pages and schedules under the old keys are not migrated: re-ingest their sitemaps")
    if [(r.match, r.path, r.device_types) for r in old] != [(r.match, r.path, r.device_types) for r in new]:
        out.append("ingress.routes: deviceTypes differ; new and re-put targets get the new devices, "
                   "existing rows keep theirs until their target is put again")
    return out


def _path_problem(path: str, seen: set[str]) -> str | None:
    if path in seen:
        return "named twice in one request"
    if path in LIVE_PATHS:
        return None
    probe: Any = Config.model_fields
    for part in path.split("."):
        f = probe.get(part) if isinstance(probe, dict) else None
        if f is None:
            return f"unknown option; live options are {', '.join(camel_path(p) for p in LIVE_PATHS)}"
        sub = getattr(f.annotation, "model_fields", None)
        probe = sub if sub is not None else {}
    return "read at start only: change the config file and restart (live options: " + \
        ", ".join(camel_path(p) for p in LIVE_PATHS) + ")"


class LiveConfig:
    """One process's effective config: the file's plus the stored overrides, re-derived only when the
    stored row changes. ``update(raw)`` returns the new config when it differs, else None; a row that
    does not validate keeps what runs and sets ``error`` (rows are validated before they are written,
    so that is a bug or a hand edit, not an admin's typo)."""

    def __init__(self, base: Config) -> None:
        self.base = base
        self.current = base
        self.raw: bytes | None = None
        self.error: str | None = None

    def update(self, raw: bytes | None) -> Config | None:
        if raw == self.raw:
            return None
        self.raw = raw
        try:
            cfg = effective(self.base, Overrides.decode(raw))
        except (OverrideError, ValidationError) as e:
            self.error = str(e)[:500]
            return None
        self.error = None
        if cfg == self.current:
            return None
        self.current = cfg
        return cfg

    def changed(self, raw: bytes | None, log: Any) -> Config | None:
        """``update``, with a row that does not apply logged on ``log`` (a structlog logger) once,
        not at every re-read of the same row."""
        fresh = raw != self.raw
        cfg = self.update(raw)
        if fresh and self.error:
            log.error("config overrides not applied", error=self.error)
        return cfg

    def names(self) -> list[str]:
        try:
            return sorted(camel_path(p) for p in Overrides.decode(self.raw).values)
        except OverrideError:
            return []
