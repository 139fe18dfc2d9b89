"""One config version, compiled once: what every layer of a process derives from the config.

The router (route classes), the key format, the scheduling rules and the result planner are built
together and share one router and one key format; the ingress decision (per set of reserved app
paths) and the URL explainer are built over them on first use. A live config change builds a new
``CompiledConfig`` and swaps it in one step (``LiveConfig.changed`` says when).
"""

from __future__ import annotations

from functools import cached_property

from prerender_ray.admin.explain import Explainer
from prerender_ray.config.model import Config
from prerender_ray.identity.cachekeys import KeyFormat
from prerender_ray.identity.routes import Router
from prerender_ray.queue.job_options import RouteOptions
from prerender_ray.queue.results import Planner
from prerender_ray.queue.targets import Rules
from prerender_ray.serving.classify import RESERVED_PATHS, Ingress


class CompiledConfig:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rules = Rules(cfg)
        self.router: Router = self.rules.router
        self.keys: KeyFormat = self.rules.keys
        self._ingress: dict[tuple[str, ...], Ingress] = {}

    @cached_property
    def planner(self) -> Planner:
        return Planner(self.rules)

    @cached_property
    def job_options(self) -> RouteOptions:
        return RouteOptions(self.cfg.render)

    @cached_property
    def explainer(self) -> Explainer:
        return Explainer(self.cfg, router=self.router, keys=self.keys)

    def ingress(self, reserved: tuple[str, ...] = RESERVED_PATHS) -> Ingress:
        """The ingress decision for an app whose own routes reserve ``reserved``."""
        found = self._ingress.get(reserved)
        if found is None:
            found = self._ingress[reserved] = Ingress(self.cfg, reserved, router=self.router, keys=self.keys)
        return found
