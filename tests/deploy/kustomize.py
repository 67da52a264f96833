"""A small Kustomize renderer: the subset ``deploy/kubernetes`` uses, so tests see what kubectl applies.

Supported ``kustomization.yaml`` keys: ``resources`` (files and folders of other
kustomizations), ``patches`` (``path:`` strategic-merge patches, matched by kind
and name), ``secretGenerator`` (``files``; with ``disableNameSuffixHash``) and
``generatorOptions``. Strategic merge as Kubernetes does it for what we patch:
maps merge key by key, lists of maps with a ``name`` merge item by item (new
names appended), other lists are replaced. :data:`SUPPORTED` lists the keys;
a kustomization using any other fails :func:`render`.
"""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "secretGenerator", "generatorOptions"}


def merge(base: Any, patch: Any) -> Any:
    """``patch`` merged into ``base`` (strategic merge, as described above)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        out_list = [dict(i) for i in base]
        names = [i["name"] for i in out_list]
        for item in patch:
            if item["name"] in names:
                at = names.index(item["name"])
                out_list[at] = merge(out_list[at], item)
            else:
                out_list.append(copy.deepcopy(item))
                names.append(item["name"])
        return out_list
    return copy.deepcopy(patch)


def key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def render(folder: Path, *, files: dict[str, bytes] | None = None) -> list[dict[str, Any]]:
    """The manifests ``kubectl apply -k folder`` would apply.

    Args:
        folder: a folder with a ``kustomization.yaml``.
        files: contents for generator files that do not exist (the token, in tests).
    """
    config = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(config) - SUPPORTED
    assert not unknown, f"{folder}: kustomization keys this renderer does not know: {unknown}"
    docs: list[dict[str, Any]] = []
    for resource in config.get("resources", []):
        path = folder / resource
        if path.is_dir():
            docs += render(path, files=files)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    options = config.get("generatorOptions", {})
    for gen in config.get("secretGenerator", []):
        assert options.get("disableNameSuffixHash"), "name suffix hashes are not rendered"
        data = {}
        for entry in gen.get("files", []):
            name, _, source = entry.partition("=")
            source = source or name
            path = folder / source
            content = path.read_bytes() if path.exists() else (files or {})[source]
            data[name] = base64.b64encode(content).decode()
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": gen["name"]},
                "type": "Opaque",
                "data": data,
            }
        )
    for patch in config.get("patches", []):
        assert set(patch) == {"path"}, f"{folder}: only `path:` patches are rendered"
        for p in yaml.safe_load_all((folder / patch["path"]).read_text()):
            at = [i for i, d in enumerate(docs) if key(d) == key(p)]
            assert at, f"{folder}/{patch['path']}: no {key(p)} to patch"
            docs[at[0]] = merge(docs[at[0]], p)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container_env(container: dict[str, Any], shard: int = 0) -> dict[str, str]:
    """The container's variables as the pod sees them (``$(VAR)`` expanded; SHARD = ``shard``)."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.labels['apps.kubernetes.io/pod-index']", path
            env[item["name"]] = str(shard)
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
    return env
