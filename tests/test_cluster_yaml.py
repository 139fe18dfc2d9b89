"""cluster.yaml must pass Ray's own config validation, and carry what prerender-ray needs."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from prerender_ray.identity.nodes import RAY_SYSTEM_CONFIG
from tests.support import REPO


def load() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_validation() -> None:
    cfg = prepare_config(copy.deepcopy(load()))
    validate_config(cfg)
    assert cfg["provider"]["type"] == "local"


def test_cluster_yaml_installs_prerender_ray_names_nodes_and_uses_token_auth() -> None:
    cfg = load()
    setup = cfg["setup_commands"]
    # as make install: the lock's pins with their hashes, the project editable, the native build
    assert any("pip install" in c and "--require-hashes" in c and "~/prerender/requirements.lock" in c for c in setup)
    assert any("pip install" in c and "-e ~/prerender" in c and "--no-deps" in c for c in setup)
    assert any("prerender_ray.native.build" in c for c in setup)
    # nothing assumes a writable /opt or root, the local venv and data never travel, and
    # `ray exec` finds prerender-ray on its login shell's PATH
    assert not any("/opt" in c or "sudo" in c for c in cfg["setup_commands"]) and "/opt" not in str(cfg["file_mounts"])
    assert {"**/.venv", "data", "*.env"} <= set(cfg["rsync_exclude"])  # *.env: a file of secrets left there
    assert any("bashrc" in c and "prerender-venv/bin" in c for c in cfg["setup_commands"])
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert "RAY_AUTH_MODE=token" in start
        assert "prerender-node=" in start and "prerender-port=" in start
    assert "~/.ray/auth_token" in cfg["file_mounts"]


def test_the_head_carries_the_ray_system_config_a_local_deployment_uses() -> None:
    """System config is set on the head only (Ray refuses it elsewhere and hands it to every node)."""
    head, workers = (" ".join(load()[k]) for k in ("head_start_ray_commands", "worker_start_ray_commands"))
    flag = re.search(r"--system-config='([^']*)'", head)
    assert flag and json.loads(flag.group(1)) == RAY_SYSTEM_CONFIG
    assert "--system-config" not in workers


def test_a_broken_cluster_yaml_is_refused_by_the_same_validation() -> None:
    cfg = load()
    cfg["provider"] = {"type": "local"}  # no head_ip
    with pytest.raises(Exception):
        validate_config(prepare_config(cfg))


INLINE_SECRET = re.compile(r"\b[A-Za-z_]*(?:PASSWORD|TOKEN|SECRET)[A-Za-z_]*=", re.IGNORECASE)


def ray_exec_examples(text: str) -> list[str]:
    """Every `ray exec` command written in ``text`` (a doc or cluster.yaml's comments), continuation
    lines joined."""
    commands, current = [], ""
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        current = f"{current} {line}" if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if "ray exec" in current:
            commands.append(current[current.index("ray exec"):])
        current = ""
    return commands


def test_no_ray_exec_example_puts_a_secret_on_the_command_line() -> None:
    """`ray exec`'s argument lands in the operator's shell history and in `ps` on the head: secrets go
    in an env file on the head that the command sources."""
    files = [REPO / "cluster.yaml", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    examples = {f.name: ray_exec_examples(f.read_text()) for f in files}
    for name in ("cluster.yaml", "operations.md"):  # the documented cluster start is checked, not skipped
        assert any("prerender-ray up" in c and ". ~/prerender.env" in c for c in examples[name]), examples[name]
    inline = [(name, c) for name, commands in examples.items() for c in commands if INLINE_SECRET.search(c)]
    assert inline == []
