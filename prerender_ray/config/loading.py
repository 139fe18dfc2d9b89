"""Loading the config: YAML file, camelCase aliases, unknown keys, secrets from the environment,
readable errors and the risky-config findings."""

from __future__ import annotations

import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake

from prerender_ray.config.base import is_loopback
from prerender_ray.config.model import MOVED_PATHS, SECRET_PATHS, UNSUPPORTED_PATHS, Config
from prerender_ray.identity.routes import compile_routes
from prerender_ray.identity.urls import DECODE_RESERVED_ALLOWED
from prerender_ray.serving.origin_policy import OriginPolicy, parse_entry
from prerender_ray.serving.proxies import parse_networks

CONFIG_ENV = "PRERENDER_CONFIG"


class ConfigError(ValueError):
    """A config that cannot be used; ``problems`` holds one line per problem, each naming its path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Finding:
    severity: str  # "warn" | "info"
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.key}: {self.message}"


@dataclass
class Loaded:
    config: Config
    warnings: list[str] = field(default_factory=list)  # about the file itself (unknown keys, moves)
    findings: list[Finding] = field(default_factory=list)  # risky settings


# ----------------------------------------------------------------------------------------- normalize


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model class, is_list) for a field annotation of Model, list[Model] or Model | None."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin in (list, tuple) and args:
        inner, _ = _model_of(args[0])
        return inner, True
    if args:  # Optional / Union / Annotated
        for a in args:
            inner, is_list = _model_of(a)
            if inner is not None:
                return inner, is_list
    return None, False


def _dict_values_model(annotation: Any) -> type[BaseModel] | None:
    """The value model of a ``dict[str, Model]`` field (Annotated included): its keys are data
    (class or bot names), not options, so only its values are normalized."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is dict:
        args = typing.get_args(annotation)
        if len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            return args[1]
    return None


def _unsupported(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in UNSUPPORTED_PATHS)


def _normalize(raw: Any, model: type[BaseModel], path: str, warnings: list[str]) -> Any:
    """Rename camelCase keys to snake_case and drop (with a warning) keys the model does not have."""
    if not isinstance(raw, dict):
        return raw  # the validator names the type problem
    extra_ok = model.model_config.get("extra") == "allow"
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            warnings.append(f"{path or '<root>'}: ignoring non-string key {key!r}")
            continue
        name = to_snake(key) if key not in model.model_fields else key
        here = f"{path}.{name}" if path else name
        if name not in model.model_fields:
            if _unsupported(here):
                warnings.append(f"{here}: not supported by prerender-ray; ignored")
            elif extra_ok:
                out[name] = value
            else:
                warnings.append(f"{here}: unknown configuration key; ignored")
            continue
        if value is None:
            continue  # absent, not a value: the default stays
        annotation = model.model_fields[name].annotation
        values_model = _dict_values_model(annotation)
        if values_model is not None:
            if isinstance(value, dict):
                value = {k: _normalize(v, values_model, f"{here}.{k}", warnings) for k, v in value.items()}
            out[name] = value
            continue
        sub, is_list = _model_of(annotation)
        if sub is not None and is_list and isinstance(value, list):
            value = [_normalize(v, sub, f"{here}[{i}]", warnings) for i, v in enumerate(value)]
        elif sub is not None and not is_list:
            value = _normalize(value, sub, here, warnings)
        out[name] = value
    return out


def _get(d: dict, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _pop(d: dict, path: str) -> Any:
    *parents, leaf = path.split(".")
    node: Any = d
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node.pop(leaf, None) if isinstance(node, dict) else None


def _set(d: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[leaf] = value


def _snake_keys(raw: dict) -> dict:
    return {to_snake(k) if isinstance(k, str) else k: v for k, v in raw.items()}


def _apply_moves(raw: dict, warnings: list[str]) -> dict:
    raw = _snake_keys(raw)
    for group in ("url", "crawl_stats"):
        if isinstance(raw.get(group), dict):
            raw[group] = _snake_keys(raw[group])
    for old, new in MOVED_PATHS.items():
        value = _pop(raw, old)
        if value is None:
            continue
        d = raw
        for part in new.split(".")[:-1]:  # snake-case the groups on the new path so lookups see them
            if not isinstance(d.get(part), dict):
                break
            d[part] = _snake_keys(d[part])
            d = d[part]
        if _get(raw, new) is not None:
            warnings.append(f"{old}: moved to {new}, which is also set; {new} wins")
        else:
            warnings.append(f"{old}: moved to {new}; please rename it")
            _set(raw, new, value)
    for group in ("url", "crawl_stats"):
        if raw.get(group) == {}:
            del raw[group]  # emptied by the moves: not an unknown key
    return raw


# ------------------------------------------------------------------------------------------ validate


MIN_SECRET_CHARS = 16  # a shared secret shorter than this is a finding: each is compared over the network
USER_SECRET = "password_hash"  # the secret field of each ``auth.users`` entry (error lines, ``redact``)


def _is_secret(path: str) -> bool:
    """A secret leaf (or something under one), or a user's password hash (``auth.users.<i>.password_hash``)."""
    parts = path.split(".")
    if len(parts) >= 4 and parts[:2] == ["auth", "users"] and parts[3] == USER_SECRET:
        return True
    return any(path == p or path.startswith(p + ".") for p in SECRET_PATHS)


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s'\"]*@")


def _hide_userinfo(line: str) -> str:
    """A URL's user and password (refused wherever a URL is an option) are not shown back in the error."""
    return _USERINFO.sub(r"\1<credentials>@", line)


def _format_errors(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"] if p not in ("function-after",)) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        if isinstance(given, dict):
            shown = ""
        elif _is_secret(path):  # these lines reach stderr and CI logs: say the type, never the value
            shown = f" (got a value of type {type(given).__name__})"
        else:
            shown = f" (got {given!r})"
        lines.append(_hide_userinfo(f"{path}: {msg}{shown}"))
    return lines


def _domains(entries: list[str]) -> None:
    for entry in entries:
        if entry.strip():
            parse_entry(entry)  # ValueError says what is wrong and what to write instead


def _decode_reserved(chars: list[str]) -> None:
    bad = [c for c in chars if c not in DECODE_RESERVED_ALLOWED]
    if bad:
        raise ValueError(f"{bad} not allowed; only characters from {''.join(sorted(DECODE_RESERVED_ALLOWED))}")


# Options whose entries need the URL, domain or proxy parsers: those modules import the model, so the
# model cannot call them (an import cycle); each is checked here, on the document the model is given,
# and reported in the model's own format.
_FIELD_CHECKS = (
    ("domains", _domains),
    ("llms_txt.sites", _domains),
    ("server.trusted_proxies", parse_networks),
    ("cache_key.decode_reserved", _decode_reserved),
)


def _check_fields(data: dict) -> list[str]:
    problems = []
    for path, check in _FIELD_CHECKS:
        value = _get(data, path)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            continue  # absent (the default is good), or not a list of strings: the model says so
        try:
            check(value)
        except ValueError as e:
            problems.append(_hide_userinfo(f"{path}: {e} (got {value!r})"))
    return problems


def _apply_secret_env(data: dict, env: typing.Mapping[str, str]) -> None:
    for path, env_path in SECRET_PATHS.items():
        var = _get(data, env_path)
        if var and env.get(var):
            _set(data, path, env[var])


def parse(raw: Any, env: typing.Mapping[str, str] | None = None) -> Loaded:
    """Validate a decoded config document. Raises ConfigError listing every problem."""
    env = os.environ if env is None else env
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"<root>: expected a mapping of options, got {type(raw).__name__}"])
    warnings: list[str] = []
    raw = _apply_moves(dict(raw), warnings)
    data = _normalize(raw, Config, "", warnings)
    _apply_secret_env(data, env)
    checked = _check_fields(data)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(checked + _format_errors(e)) from None
    if checked:
        raise ConfigError(checked)
    compiled = compile_routes(cfg)
    warnings.extend(compiled.warnings)
    problems = list(compiled.errors)
    if not is_loopback(cfg.server.host) and not cfg.domains and not cfg.allow_any_domain:
        problems.append(
            f"domains: empty on a non-loopback listener ({cfg.server.host}) would make an open proxy; "
            "list the site's hosts in domains, or set allowAnyDomain: true"
        )
    ours = {parse_entry(d).host for d in cfg.domains}  # each parsed above
    if outside := [h for h in cfg.index_now.hosts if h not in ours]:
        problems.append(f"indexNow.hosts: {outside} are not hosts of a `domains` entry")
    for user in cfg.auth.users:
        if user.password_env and not env.get(user.password_env):
            warnings.append(f"auth.users[{user.name}]: {user.password_env} is not set; this user cannot sign in")
    if problems:
        raise ConfigError(problems)
    return Loaded(cfg, warnings, findings(cfg, compiled.prerender_count))


def load(path: str | os.PathLike | None, env: typing.Mapping[str, str] | None = None) -> Loaded:
    """Read a YAML config file (or the PRERENDER_CONFIG file, or the embedded defaults)."""
    env = os.environ if env is None else env
    path = path or env.get(CONFIG_ENV) or None
    if path is None:
        return parse({}, env)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{p}: cannot read config file: {e.strerror or e}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise ConfigError([f"{p}: not valid YAML{at}: {getattr(e, 'problem', None) or e}"]) from None
    # A reference deployment nests its options under a `prerender:` key; accept both shapes.
    if isinstance(raw, dict) and set(raw) == {"prerender"}:
        raw = raw["prerender"]
    return parse(raw, env)


# ------------------------------------------------------------------------------------------- findings


def findings(cfg: Config, prerender_routes: int) -> list[Finding]:
    """Risky settings, computed once per config and shown by `config check`, start-up and the admin API."""
    out: list[Finding] = []
    add = lambda sev, key, msg: out.append(Finding(sev, key, msg))  # noqa: E731
    if not cfg.origin.security_token.value:
        add("warn", "origin.security_token.value", "empty: the origin cannot tell prerender traffic apart")
    if not cfg.domains:
        if cfg.allow_any_domain:
            add("warn", "domains", "empty with allowAnyDomain: any host may be fetched and cached (open proxy)"
                + ("; only public addresses are connected to, and the security token goes to every host fetched"
                   if OriginPolicy(cfg).public_only else "")
                + ("; bots' POST and other methods are relayed to any host (origin.proxyOtherMethods: false "
                   "refuses them)" if cfg.origin.proxy_other_methods else ""))
        else:
            add("warn", "domains", "empty: every host is treated as indexable (allowed on loopback only)")
    if cfg.ingress.mode == "forwarded" and prerender_routes == 0:
        add("warn", "ingress.routes", "forwarded mode with no prerender route: nothing will be prerendered")
    st = cfg.origin.staging
    if st.ip and not st.header:
        add("warn", "origin.staging.header", "staging ip set but header empty: staging pinning is disabled")
    elif st.ip:
        add("info", "origin.staging.ip", f"requests carrying {st.header} are fetched from {st.ip}")
    rn = cfg.render_now
    if rn.enabled and not rn.header:
        add("warn", "render_now.header", "render-now enabled with an empty header: DISABLED")
    if rn.enabled and not rn.token:
        env = f" ({rn.value_env} is not set)" if rn.value_env else ""
        add("warn", "render_now.token", f"render-now enabled without a token{env}: DISABLED, fails closed")
    pr = cfg.peer_rescue
    if pr.enabled and not pr.token:
        env = f" ({pr.value_env} is not set)" if pr.value_env else ""
        add("warn", "peer_rescue.token", f"peer rescue enabled without a token{env}: DISABLED, fails closed")
    for key, secret in (("origin.security_token.value", cfg.origin.security_token.value),
                        ("render_now.token", rn.token if rn.enabled else ""),
                        ("peer_rescue.token", pr.token if pr.enabled else "")):
        if 0 < len(secret) < MIN_SECRET_CHARS:
            add("warn", key, f"shorter than {MIN_SECRET_CHARS} characters: guessable over the network "
                "(use 32 random ones)")
    if not cfg.auth.users:
        add("warn", "auth.users", "no users: only loopback requests are authorized")
    if not is_loopback(cfg.server.host) and not cfg.server.tls.cert_file:
        add(
            "info",
            "server.tls",
            "plain HTTP on a non-loopback listener: the reference render fleet uses https for such hosts",
        )
    out.extend(_bot_findings(cfg))
    return out


def _bot_findings(cfg: Config) -> list[Finding]:
    """Bot names in policies and verification that the registry does not know: a typo there never
    matches (a name derived from an unknown User-Agent still may, so a warning, not an error)."""
    from prerender_ray.serving.bots import BotRegistry

    known = BotRegistry.from_config(cfg).names()
    bots = cfg.bots
    out = []
    for key, names in (("bots.named", bots.named), ("bots.verify.dns", bots.verify.dns),
                       ("bots.verify.ranges", bots.verify.ranges)):
        unknown = sorted(n for n in names if n.lower() not in known)
        if unknown:
            out.append(Finding("warn", key, f"not a registry bot name: {', '.join(unknown)[:300]} "
                                            "(matches only a name derived from a User-Agent)"))
    if bots.verify.enabled and bots.failed_class == "other" and \
            (bots.classes.get("other") or bots.default).serve == "prerender":
        out.append(Finding("info", "bots.failed_class", "failed verification is served as class other, "
                                                        "which is prerendered: spoofers get what real bots get"))
    return out


def explain_domains(cfg: Config) -> list[str]:
    """What each ``domains`` entry lets the service fetch and serve (``config check``)."""
    if not cfg.domains:
        return ["domains: empty: any host and port" + (
            " (allowAnyDomain)" if cfg.allow_any_domain else " while the listener is loopback, else none")]
    return [f"domains: {d!r} allows {parse_entry(d).describe()}" for d in cfg.domains]


def explain_discovery(cfg: Config) -> list[str]:
    """What bot misses may add to the queue (``bots.discovery``, ``config check``)."""
    budget, replicas = cfg.bots.discovery, cfg.server.replicas
    if budget.per_minute == 0 or budget.max_unrendered == 0:
        return ["discovery: off (bots.discovery.perMinute or maxUnrendered is 0): bot misses make no new target"]
    bots = cfg.bots
    off = [f"class {c}" for c, p in bots.classes.items() if not p.discover]
    off += [f"bot {n}" for n, p in bots.named.items() if not p.discover]
    if not bots.default.discover:
        off.append("every other class (bots.default)")
    lines = [
        f"discovery: bot misses make at most {budget.per_minute} new targets per site and minute on each node "
        f"({budget.per_minute / replicas:g} per ingress replica, {replicas} replicas); the cluster's rate is that "
        "times the nodes bots reach",
        f"discovery: at most {budget.max_unrendered} discovered targets per site wait for their first render "
        "result, across the cluster (each owner node counts its share, ceil(maxUnrendered / nodes)); at it, "
        "that site's misses make no new target until results come",
        "discovery: a URL with a target already (a sitemap's, a PUT's, discovered) costs nothing; a bot claim "
        "that failed or is not verified yet never discovers; refusals: prerender_discovery_refused_total{reason} "
        "and queue-state `discovery`; the bot is served the same either way",
    ]
    if off:
        lines.append(f"discovery: off by policy for {', '.join(off)}")
    return lines


def secret_env_vars(cfg: Config) -> set[str]:
    """The environment variables this config reads its secrets and users' passwords from."""
    data = cfg.model_dump()
    names = {_get(data, env_path) for env_path in SECRET_PATHS.values()}
    return {n for n in names | {u.password_env for u in cfg.auth.users} if n}


def redact(cfg: Config) -> dict:
    """The effective config as plain data, secrets shown only as set/unset and password hashes as
    ``<set>`` / ``<empty>`` (a hash is open to an offline guess at the password)."""
    data = cfg.model_dump(mode="json")
    for path in SECRET_PATHS:
        value = _get(data, path)
        _set(data, path, f"<set: {len(value)} chars>" if value else "<empty>")
    for user in data["auth"]["users"]:
        user[USER_SECRET] = "<set>" if user[USER_SECRET] else "<empty>"
    return data


# ------------------------------------------------------------------------------------------ reference


def reference_rows(model: type[BaseModel] = Config, prefix: str = "",
                   defaults: dict | None = None) -> list[tuple[str, str, str, str]]:
    """(path, camelCase alias, default, description) for every leaf option, for the README."""
    defaults = Config().model_dump(mode="json") if defaults is None else defaults
    rows = []
    for name, f in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        sub, is_list = _model_of(f.annotation)
        if sub is not None and not is_list and sub.__name__ != "UserAgents" and \
                _dict_values_model(f.annotation) is None:
            rows.extend(reference_rows(sub, path, defaults))
            continue
        value = _get(defaults, path)
        shown = "<secret>" if path in SECRET_PATHS else yaml.safe_dump(
            value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
        alias = ".".join(to_camel_path(p) for p in path.split("."))
        rows.append((path, alias, shown, f.description or ""))
    return rows


def to_camel_path(part: str) -> str:
    head, *rest = part.split("_")
    return head + "".join(w.title() for w in rest)


def reference_markdown() -> str:
    lines = ["| option (camelCase alias) | default | notes |", "|---|---|---|"]
    for path, alias, default, desc in reference_rows():
        name = f"`{path}`" + (f" (`{alias}`)" if alias != path else "")
        if len(default) > 60:
            default = default[:57] + "..."
        cell = lambda t: t.replace("|", "\\|")  # noqa: E731
        lines.append(f"| {name} | `{cell(default)}` | {cell(desc)} |")
    return "\n".join(lines) + "\n"
