"""What a bot gets, by its name, class and verification (``bots`` in the config). Pure.

A policy (``bots.named`` for the bot's name, else ``bots.classes`` for its class, else
``bots.default``) says how a request is served: ``prerender`` (the cache, then a miss as usual),
``origin`` (proxied to the origin: no cache read, no render) or ``deny`` (``bots.denyStatus`` with a
short body, nothing read), and whether a miss may discover a new page. A claim that failed
verification is served as ``bots.failedClass``, never by the name it claims: a spoofed Googlebot
must not get what Googlebot gets. A claim that failed verification, or is not verified yet, never
discovers, whatever its policy says: it claims to be a bot it may not be, and new targets are for
traffic we can believe (``withheld`` says why). The default config prerenders everything; discovery
is on for every request but those.

The reference's test marker (``harper: pre-render``, the name ``debug``) is decided as ``other``,
and never discovers.

A policy with ``requireSignature`` is for requests a Web Bot Auth signature verifies (``signed``)
only: any other request it would apply to is served as a failed claim (``source`` ``unsigned``,
verification ``unverified``), whatever ``whileUnverified`` says: unlike a DNS answer that is late, a
missing signature never turns up, so serving it "as claimed for now" would make the option a no-op.

With ``bots.contentSignals.applyAsDefaults``, what a site's robots.txt declares
(``sitemaps/content_signals.py``) sets the policy of the class it concerns on that site, in place of
``bots.default`` or the built-in ``classes`` entry; a ``bots.named`` policy, a ``bots.classes`` entry the
operator wrote and a failed claim are never changed by it (``source`` says which policy applied).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prerender_ray.queue.discovery import FAILED_CLAIM, UNVERIFIED_CLAIM
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.bots import DEBUG, OTHER, BotRegistry
from prerender_ray.sitemaps.content_signals import USE_OF_CLASS, Signals, robots_token

if TYPE_CHECKING:
    from prerender_ray.config.bots import BotPolicy, Bots

# Verification states of one request (prerender_ray.serving.verification).
UNCHECKED = "unchecked"  # no method for this bot, or verification off
VERIFIED = "verified"
FAILED = "failed"  # the address is not the operator's (a spoof, or a resolver that lied)
UNVERIFIED = "unverified"  # not known yet: past the deadline, a lookup timed out or errored
VERIFICATION_STATES = (UNCHECKED, VERIFIED, FAILED, UNVERIFIED)
MEMO = 4_096  # decisions remembered per policy set (names can be derived from any User-Agent)


@dataclass(frozen=True, slots=True)
class Decision:
    serve: str  # prerender | origin | deny
    discover: bool
    bot_class: str  # the class the request is served as
    verification: str
    withheld: str = ""  # why discovery is off although the policy allows it (queue.discovery reasons)
    # which policy: named | class | builtin | default | failed | unsigned | signal:<use>=yes|no
    source: str = ""


class Policies:
    """The ``bots`` policies of one config, compiled; build one per config (they are live options)."""

    def __init__(self, cfg: Bots, registry: BotRegistry):
        self.registry = registry
        self.default = cfg.default
        self.classes = dict(cfg.classes)
        self.named = {name.lower(): p for name, p in cfg.named.items()}
        self.failed_class = cfg.failed_class
        # The built-in classes entry (search) is the project's default, not the operator's word.
        self.operator_classes = set() if cfg.classes == type(cfg).model_fields["classes"].default else set(cfg.classes)
        signals = cfg.content_signals
        self.signals_on = signals.apply_as_defaults
        self.allowed, self.refused = signals.allowed, signals.refused
        self.unverified_fails = cfg.verify.while_unverified == "failed"
        self.deny = _deny_reply(cfg.deny_status, cfg.deny_body)
        self._memo: dict[tuple[str, str, bool], Decision] = {}

    def decide(self, name: str, verification: str = UNCHECKED, site: Signals | None = None,
               signed: bool = False) -> Decision:
        """``site``: what the request's site declares (only read with ``applyAsDefaults``); ``signed``:
        a valid Web Bot Auth signature of an agent that covers ``name`` verified the request."""
        if name == DEBUG:
            # The reference's marker for its own test traffic (``harper: pre-render``) lifts nothing:
            # anyone can send it, so it gets what an unidentified client gets (``other``: its policy,
            # failure rules and requireSignature included), and never discovers (no target, no
            # on-miss render); it still sees the bot path's answer to test it.
            marked = self.decide(OTHER, verification, site, signed)
            return replace(marked, discover=False) if marked.discover else marked
        key = (name, verification, signed)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO:
                self._memo.clear()
            found = self._memo[key] = self._decide(name, verification, signed)
        if site and self.signals_on and found.source in ("builtin", "default"):
            use = USE_OF_CLASS.get(found.bot_class)
            allowed = site.for_token(robots_token(name)).get(use) if use is not None else None
            if allowed is not None:
                return self._signal(found.bot_class, verification, use, allowed)  # type: ignore[arg-type]
        return found

    def for_class(self, cls: str, site: Signals | None, token: str) -> Decision:
        """What a bot of ``cls`` with no name policy, claiming ``token`` on the site, is served (the report)."""
        policy, source = self._class_policy(cls)
        use = USE_OF_CLASS.get(cls)
        if site and self.signals_on and source in ("builtin", "default") and use is not None:
            allowed = site.for_token(token).get(use)
            if allowed is not None:
                return self._signal(cls, UNCHECKED, use, allowed)
        return Decision(policy.serve, policy.discover, cls, UNCHECKED, source=source)

    def explicit(self, cls: str) -> dict | None:
        """The policy the operator set for a class (``bots.classes``), or None."""
        p = self.classes.get(cls) if cls in self.operator_classes else None
        return None if p is None else {"serve": p.serve, "discover": p.discover}

    def _class_policy(self, cls: str) -> tuple[BotPolicy, str]:
        policy = self.classes.get(cls)  # type: ignore[call-overload]
        if policy is None:
            return self.default, "default"
        return policy, "class" if cls in self.operator_classes else "builtin"

    def _signal(self, cls: str, verification: str, use: str, allowed: bool) -> Decision:
        key = (cls, verification, use, allowed)
        found = self._memo.get(key)  # type: ignore[arg-type]
        if found is None:
            policy = self.allowed if allowed else self.refused
            withheld = ""
            if policy.discover and verification in (FAILED, UNVERIFIED):
                withheld = FAILED_CLAIM if verification == FAILED else UNVERIFIED_CLAIM
            found = self._memo[key] = Decision(  # type: ignore[index]
                policy.serve, policy.discover and not withheld, cls, verification, withheld,
                f"signal:{use}={'yes' if allowed else 'no'}")
        return found

    def _decide(self, name: str, verification: str, signed: bool) -> Decision:
        failed = verification == FAILED or (verification == UNVERIFIED and self.unverified_fails)
        policy: BotPolicy | None
        if failed:
            cls: str = self.failed_class
            policy, source = self.classes.get(self.failed_class) or self.default, "failed"
        else:
            cls = self.registry.class_of(name)
            policy, source = self.named.get(name.lower()), "named"
            if policy is None:
                policy, source = self._class_policy(cls)
            if policy.require_signature and not signed:
                cls, verification = self.failed_class, UNVERIFIED
                policy, source = self.classes.get(self.failed_class) or self.default, "unsigned"
        withheld = ""
        if policy.discover and verification in (FAILED, UNVERIFIED):
            withheld = FAILED_CLAIM if verification == FAILED else UNVERIFIED_CLAIM
        return Decision(policy.serve, policy.discover and not withheld, cls, verification, withheld, source)

    def deny_reply(self) -> Reply:
        """A fresh copy: callers add headers to a reply."""
        return Reply(self.deny.status, dict(self.deny.headers), self.deny.body)


def _deny_reply(status: int, body: str) -> Reply:
    data = body.encode("utf-8")
    return Reply(status, {"content-type": "text/plain; charset=utf-8", "content-length": str(len(data)),
                          "cache-control": "no-store"}, data)
