"""One config version compiled once: every derived object shares one router and one key format."""

from prerender_ray.compiled import CompiledConfig
from prerender_ray.config.loading import parse


def test_every_part_shares_one_router_and_one_key_format() -> None:
    c = CompiledConfig(parse({"domains": ["shop.test"]}, {}).config)
    ingress, explainer = c.ingress(("/mine",)), c.explainer
    assert c.rules.router is c.router is ingress.router is explainer.router
    assert c.rules.keys is c.keys is ingress.keys is explainer.keys
    assert c.planner is c.planner and c.ingress(("/mine",)) is ingress  # built once
    assert c.ingress(("/other",)) is not ingress and c.ingress(("/other",)).reserved == ("/other",)


def test_a_new_version_compiles_anew() -> None:
    raw = {"domains": ["shop.test"], "ingress": {"routes": [{"match": "prefix", "path": "/p/", "mode": "passthrough"}]}}
    before, after = CompiledConfig(parse({"domains": ["shop.test"]}, {}).config), CompiledConfig(parse(raw, {}).config)
    assert before.router is not after.router
    assert after.router.classify("/p/x") != before.router.classify("/p/x")
