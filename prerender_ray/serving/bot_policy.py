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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prerender_ray.queue.discovery import FAILED_CLAIM, UNVERIFIED_CLAIM
from prerender_ray.serving.answer import Reply
from prerender_ray.serving.bots import DEBUG, BotRegistry

if TYPE_CHECKING:
    from prerender_ray.config.model import BotPolicy, Bots

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


class Policies:
    """The ``bots`` policies of one config, compiled; build one per config (they are live options)."""

    def __init__(self, cfg: Bots, registry: BotRegistry):
        self.registry = registry
        self.default = cfg.default
        self.classes = dict(cfg.classes)
        self.named = {name.lower(): p for name, p in cfg.named.items()}
        self.failed_class = cfg.failed_class
        self.unverified_fails = cfg.verify.while_unverified == "failed"
        self.deny = _deny_reply(cfg.deny_status, cfg.deny_body)
        self._memo: dict[tuple[str, str], Decision] = {}

    def decide(self, name: str, verification: str = UNCHECKED) -> Decision:
        key = (name, verification)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= MEMO:
                self._memo.clear()
            found = self._memo[key] = self._decide(name, verification)
        return found

    def _decide(self, name: str, verification: str) -> Decision:
        if name == DEBUG:  # the reference's marker for its own test traffic: always served as usual
            return Decision("prerender", True, self.registry.class_of(name), verification)
        failed = verification == FAILED or (verification == UNVERIFIED and self.unverified_fails)
        policy: BotPolicy | None
        if failed:
            cls: str = self.failed_class
            policy = self.classes.get(self.failed_class)
        else:
            cls = self.registry.class_of(name)
            policy = self.named.get(name.lower()) or self.classes.get(cls)  # type: ignore[call-overload]
        policy = policy or self.default
        withheld = ""
        if policy.discover and verification in (FAILED, UNVERIFIED):
            withheld = FAILED_CLAIM if verification == FAILED else UNVERIFIED_CLAIM
        return Decision(policy.serve, policy.discover and not withheld, cls, verification, withheld)

    def deny_reply(self) -> Reply:
        """A fresh copy: callers add headers to a reply."""
        return Reply(self.deny.status, dict(self.deny.headers), self.deny.body)


def _deny_reply(status: int, body: str) -> Reply:
    data = body.encode("utf-8")
    return Reply(status, {"content-type": "text/plain; charset=utf-8", "content-length": str(len(data)),
                          "cache-control": "no-store"}, data)
