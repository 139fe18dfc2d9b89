"""Per bot class, what one ingress replica served since it started: serves by verification state and
method, verification outcomes by method and reason, Markdown answers and misses (the admin ``bots``
report merges every replica's; Prometheus has the same node-wide, ``prerender_bot_class_serves_total``,
``prerender_bot_verifications_total``, ``prerender_bot_markdown_served_total``). Pure.

Every key comes from a bounded set (the classes, states, methods and reasons are constants), and a
value outside it is folded into ``other``, so the tally cannot grow with what bots send.
"""

from __future__ import annotations

import copy

from prerender_ray.serving.bot_policy import VERIFICATION_STATES
from prerender_ray.serving.bots import BOT_CLASSES

METHODS = ("signature", "dns", "ranges", "none")
OTHER_KEY = "other"


def _zeros(keys: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(keys, 0)


class ClassStats:
    def __init__(self, reasons: dict[str, tuple[str, ...]]):
        """``reasons``: each method's outcomes (the signature's, the DNS and range check's)."""
        self.reasons = reasons
        self.classes = {cls: self._empty() for cls in BOT_CLASSES}

    def _empty(self) -> dict:
        return {"serves": 0, "verification": _zeros(VERIFICATION_STATES), "method": _zeros(METHODS),
                "outcomes": {m: _zeros(r) for m, r in self.reasons.items()}, "markdown": 0, "misses": 0}

    def _of(self, cls: str) -> dict:
        return self.classes.get(cls) or self.classes[OTHER_KEY]

    def served(self, cls: str, verification: str, method: str, cache_status: str, markdown: bool) -> None:
        row = self._of(cls)
        row["serves"] += 1
        _add(row["verification"], verification)
        _add(row["method"], method)
        row["markdown"] += markdown
        row["misses"] += cache_status == "miss"

    def verified(self, cls: str, method: str, outcome: str) -> None:
        found = self._of(cls)["outcomes"].get(method)
        if found is not None:
            _add(found, outcome)

    def snapshot(self) -> dict:
        return copy.deepcopy(self.classes)


def _add(counts: dict[str, int], key: str) -> None:
    if key not in counts:
        key = OTHER_KEY
        counts.setdefault(key, 0)
    counts[key] += 1
