"""Every RocksDB key prefix is declared in storage/keys.py, and none shadows another in its store."""

import itertools
import re
from pathlib import Path

from prerender_ray.storage import keys
from tests.support import REPO

PREFIX = re.compile(r'^(?![A-Z_]*MAGIC\b)[A-Z_]+(?:: \w+)? = b"(?!\\x1f\\x8b|PG")', re.M)  # a bytes constant (not a magic number)


def test_no_prefix_of_a_store_is_a_prefix_of_another() -> None:
    for group in (keys.REGISTRY_PREFIXES, keys.PAGE_PREFIXES, keys.LEASE_PREFIXES):
        assert len(set(group)) == len(group)
        for a, b in itertools.permutations(group, 2):
            assert not b.startswith(a), (a, b)


def test_key_prefixes_are_declared_in_the_keys_module_only() -> None:
    declared = {name for name, value in vars(keys).items() if isinstance(value, bytes)}
    assert (set(keys.REGISTRY_PREFIXES) | set(keys.PAGE_PREFIXES) | set(keys.LEASE_PREFIXES)
            | set(keys.SCHEDULE_PREFIXES)) == {getattr(keys, n) for n in declared}
    elsewhere = []
    for top in ("prerender_ray", "actors", "api", "worker", "cli"):
        for path in (REPO / top).rglob("*.py"):
            if path.resolve() == Path(keys.__file__).resolve() or ".venv" in path.parts:
                continue
            elsewhere += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in PREFIX.finditer(path.read_text())]
    assert elsewhere == []
