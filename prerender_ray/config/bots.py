"""The sections on bots: the bot registry and its counts (analytics), and what each bot gets (policies by
class and name, verification by DNS and IP ranges, Web Bot Auth signatures, the discovery budget,
robots.txt content signals)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator

from prerender_ray.config.base import (
    DAY,
    HOUR,
    MINUTE,
    SECOND,
    Model,
    NonEmptyStr,
    PositiveDuration,
    _duration,
    clean_host,
    is_loopback,
)

BotClass = Literal["search", "ai-search", "ai-training", "social", "seo-tool", "other"]
BOT_CLASSES: tuple[str, ...] = get_args(BotClass)


class Bot(Model):
    name: NonEmptyStr
    match: NonEmptyStr
    bot_class: BotClass | None = None  # None: the built-in entry's class of this name, else other


class Analytics(Model):
    enabled: bool = Field(True, description="Count bot requests by bot name.")
    record_unmatched: bool = Field(
        True, description="Also count requests whose user agent matches no known bot."
    )
    derive_unknown_bots: bool = Field(
        True, description="Derive a bot name from an unknown bot-like user agent. A user agent is read up to "
                          "its first 1,024 characters."
    )
    missed_urls: int = Field(
        200, ge=0, le=10_000, description="URLs without a cached page kept per bot class for the admin "
        "`bots` report (the least recently asked evicted first; 0: none)."
    )
    # None = the built-in registry (prerender_ray.serving.bots.DEFAULT_BOTS); a list replaces it wholesale.
    bots: list[Bot] | None = Field(
        None, description="`{name, match, botClass?}` bot registry replacing the built-in one (null = built-in)."
    )


MAX_BOT_NAME = 100
MAX_DENY_BODY = 1024
MAX_RANGE_FILES = 50


class BotPolicy(Model):
    serve: Literal["prerender", "origin", "deny"] = Field(
        "prerender", description="`prerender` (the cache, then a miss as usual), `origin` (proxied to "
        "the origin: no cache read, no render) or `deny` (`bots.denyStatus` with `bots.denyBody`)."
    )
    discover: bool = Field(True, description="A miss the origin answers with an indexable page makes it a target.")
    require_signature: bool = Field(
        False, description="Only a request with a valid Web Bot Auth signature (`bots.webBotAuth`) gets this policy; "
        "any other is served as a failed claim (`bots.failedClass`, never discovers), whatever `whileUnverified` "
        "says: a missing signature never turns up later."
    )


def _bot_names(value: Any) -> Any:
    if isinstance(value, dict):
        for name in value:
            if not isinstance(name, str) or not 0 < len(name) <= MAX_BOT_NAME:
                raise ValueError(f"a bot name is 1 to {MAX_BOT_NAME} characters: {str(name)[:120]!r}")
    return value


def _host_suffixes(value: Any) -> Any:
    if isinstance(value, dict):
        value = _bot_names(value)
        return {k: [clean_host(h) if isinstance(h, str) else h for h in v] if isinstance(v, list) else v
                for k, v in value.items()}
    return value


class Verify(Model):
    enabled: bool = Field(
        False, description="Check that a request claiming a verifiable crawler comes from its operator "
        "(reverse DNS confirmed forward, or the operator's published IP ranges)."
    )
    deadline_ms: Annotated[int, BeforeValidator(_duration), Field(ge=1, le=5_000)] = Field(
        50, description="Longest a request waits for a check; then it is served unverified-for-now and the "
        "check finishes in the background."
    )
    lookup_timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=10, le=30_000)] = Field(
        2_000, description="Deadline of one background check (both DNS lookups); past it the claim is unverified."
    )
    ttl: PositiveDuration = Field(6 * HOUR, description="How long a verified or failed answer is remembered per address.")
    retry_after: PositiveDuration = Field(
        MINUTE, description="How long an unverified answer (a lookup that timed out or errored) is remembered."
    )
    cache_size: int = Field(10_000, ge=1, le=1_000_000, description="Addresses remembered (least recent evicted).")
    max_pending: int = Field(64, ge=1, le=10_000, description="Checks running at once; further claims are unverified.")
    builtin_dns: bool = Field(
        True, description="Use the built-in reverse-DNS domains (Google, Bing, Apple, Yandex, Baidu, Amazon ...; "
        "`prerender_ray.serving.verification.BUILTIN_DNS`)."
    )
    dns: Annotated[dict[str, list[str]], BeforeValidator(_host_suffixes)] = Field(
        {}, description="Bot name -> domains its reverse DNS must be in (`googlebot.com` allows "
        "`crawl-1.googlebot.com`), then confirmed forward; replaces a built-in entry of that name."
    )
    ranges: Annotated[dict[str, list[str]], BeforeValidator(_bot_names)] = Field(
        {}, description="Bot name -> the operator's published IP ranges: absolute file paths or the operator's "
        "http(s) URLs (JSON `{prefixes: [{ipv4Prefix}|{ipv6Prefix}]}` or one CIDR a line); a bot with ranges is "
        "checked by them."
    )
    range_refresh: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        HOUR, description="How often the range files and URLs are read again (a bad read keeps the previous ranges)."
    )
    max_range_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Largest range file read.")
    max_prefixes: int = Field(50_000, ge=1, le=1_000_000, description="Prefixes kept per range file.")
    while_unverified: Literal["claimed", "failed"] = Field(
        "claimed", description="A claim not verified yet (past the deadline, or its lookup timed out) is served "
        "as the bot it claims (`claimed`) or as a failed claim (`failed`)."
    )

    @field_validator("ranges")
    @classmethod
    def _files(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if sum(len(files) for files in v.values()) > MAX_RANGE_FILES:
            raise ValueError(f"at most {MAX_RANGE_FILES} range files")
        for f in (f.strip() for files in v.values() for f in files):
            if f.startswith(("https://", "http://")):
                parts = urlsplit(f)
                if not parts.hostname or parts.username or parts.password or len(f) > 2048:
                    raise ValueError(f"a range URL is http(s)://host/path, without credentials: {f[:120]!r}")
            elif not f.startswith("/"):
                # every ingress replica reads them, in processes whose working directory is Ray's
                raise ValueError("a range source is an absolute path or an http(s) URL")
        return v


class DiscoveryBudget(Model):
    per_minute: int = Field(
        60, ge=0, le=100_000, description="New targets bot misses may make per site (the URL's host) and minute "
        "on each node, split over its ingress replicas (a minute's worth at once); 0: none. A URL with a target "
        "already costs nothing."
    )
    max_unrendered: int = Field(
        1_000, ge=0, le=1_000_000, description="Discovered targets per site that have had no render result yet, "
        "across the cluster (each owner node counts its share of the URLs); at it, misses of that site make "
        "no new target until results come."
    )


MAX_SIGNATURE_AGENTS = 64
MAX_AGENT_BOTS = 64  # bot names one signature agent may verify


def _agent_origins(value: Any) -> Any:
    """``https://host[:port]`` (``http`` for a loopback host only), as an origin: lower-cased, default port
    and a trailing ``/`` dropped."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_SIGNATURE_AGENTS:
        raise ValueError(f"at most {MAX_SIGNATURE_AGENTS} signature agents")
    out: list[Any] = []
    for entry in value:
        rest: dict[str, Any] = {}
        if isinstance(entry, dict):  # {origin, bots}: the origin spelled as a plain entry's
            rest, entry = dict(entry), entry.get("origin")
        if not isinstance(entry, str):
            return value  # the list validator says what is wrong
        text = entry.strip()
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            raise ValueError(f"a signature agent is an origin such as https://agent.example: {text[:120]!r}") from None
        host = (parts.hostname or "").lower()
        loopback = is_loopback(host)
        if (parts.scheme.lower() not in ("https", "http") or not host or parts.username or parts.password
                or parts.path not in ("", "/") or parts.query or parts.fragment
                or (parts.scheme.lower() == "http" and not loopback)):
            raise ValueError(f"a signature agent is an https origin such as https://agent.example (http only on a "
                             f"loopback host): {text[:120]!r}")
        scheme = parts.scheme.lower()
        name = f"[{host}]" if ":" in host else host
        default = {"http": 80, "https": 443}[scheme]
        origin = f"{scheme}://{name}" if port in (None, default) else f"{scheme}://{name}:{port}"
        out.append({**rest, "origin": origin})
    return out


class SignatureAgent(Model):
    origin: str = Field(description="The agent's origin, e.g. `https://chatgpt.com`.")
    bots: list[Annotated[str, Field(min_length=1, max_length=MAX_BOT_NAME)]] | None = Field(
        None, max_length=MAX_AGENT_BOTS, description="The bot names (as `analytics.bots` names them, "
        "case-insensitive) its signature verifies; another name it signs for is `agent-mismatch`. Unset: any name but "
        "those verified by reverse DNS or ranges (`bots.verify.dns`, `ranges`, the built-in domains)."
    )


class WebBotAuthConfig(Model):
    agents: Annotated[list[SignatureAgent], BeforeValidator(_agent_origins)] = Field(
        [], description="Signature agents whose HTTP Message Signatures are verified (Web Bot Auth): an origin "
        "(`https://chatgpt.com`) or `{origin, bots}`. Their key directories are fetched, and a valid signature "
        "makes a request verified for the bot names the agent covers. Empty: off. A signature by any other agent "
        "counts as none and fetches nothing."
    )
    skew: Annotated[int, BeforeValidator(_duration), Field(ge=0, le=10 * MINUTE)] = Field(
        MINUTE, description="Clock difference allowed on a signature's `created` and `expires`."
    )
    max_age: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND, le=DAY)] = Field(
        5 * MINUTE, description="A signature is accepted this long after its `created` (the replay window), "
        "and never past its `expires`."
    )
    key_ttl: Annotated[int, BeforeValidator(_duration), Field(ge=MINUTE)] = Field(
        HOUR, description="How long an agent's key directory is used before it is fetched again (the last good "
        "copy stays in use while a fetch fails)."
    )
    retry_after: Annotated[int, BeforeValidator(_duration), Field(ge=SECOND)] = Field(
        MINUTE, description="Least time between two fetches of one agent's key directory (a failed one, or one "
        "asked for by an unknown key id)."
    )
    fetch_timeout_ms: Annotated[int, BeforeValidator(_duration), Field(ge=100, le=60_000)] = Field(
        5_000, description="Deadline of one key-directory fetch, whole."
    )
    max_directory_bytes: int = Field(
        64 * 1024, ge=1024, le=1024 * 1024, description="Largest key directory read."
    )


class ContentSignals(Model):
    apply_as_defaults: bool = Field(
        False, description="A site's robots.txt `Content-Signal` (search, ai-input, ai-train) and `Content-Usage` "
        "(aipref: search, train-ai) lines set the policy of the matching class (search, ai-search, ai-training) "
        "for that site where the operator set none (`bots.classes`, `bots.named`): `allowed` for a yes, `refused` "
        "for a no. Read from the robots.txt discovery fetched (`robots`)."
    )
    allowed: BotPolicy = Field(BotPolicy(), description="Policy of a class whose use the site allows.")
    refused: BotPolicy = Field(
        BotPolicy(serve="deny", discover=False), description="Policy of a class whose use the site refuses."
    )


class Bots(Model):
    default: BotPolicy = Field(BotPolicy(), description="Policy of a class `classes` does not name.")
    classes: dict[BotClass, BotPolicy] = Field(
        {"search": BotPolicy()},
        description="Policy per bot class (search, ai-search, ai-training, social, seo-tool, other; "
        "`analytics.bots`). `search` (Googlebot, Bingbot ...) is prerendered by default: an explicit choice, "
        "since Google renders JavaScript itself and calls dynamic rendering a workaround.",
    )
    named: Annotated[dict[str, BotPolicy], BeforeValidator(_bot_names)] = Field(
        {}, description="Policy per bot name (e.g. `Googlebot`, case-insensitive), over its class's."
    )
    deny_status: int = Field(403, ge=400, le=599, description="Status of a `deny` answer.")
    deny_body: str = Field(
        "Forbidden", max_length=MAX_DENY_BODY, description="Body of a `deny` answer (text/plain)."
    )
    failed_class: BotClass = Field(
        "other", description="A claim that fails verification is served as this class (never by its name)."
    )
    verify: Verify = Verify()
    web_bot_auth: WebBotAuthConfig = WebBotAuthConfig()
    discovery: DiscoveryBudget = DiscoveryBudget()
    content_signals: ContentSignals = ContentSignals()
