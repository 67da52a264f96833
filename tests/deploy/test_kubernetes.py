"""deploy/kubernetes: every manifest, and every overlay as rendered, is valid Kubernetes and
agrees with the CLI (ports, probes, variables, the token file, the data root on a PVC)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploykit import REPO, env_vars, parse_serve, settings_from_env
from kustomize import container_env, find, merge, render

from tdreplay.service.security import PUBLIC_PATHS

K8S = REPO / "deploy" / "kubernetes"
VERSION = "1.37.0"  # the newest schemas kubernetes-validate bundles; no network needed
FOLDERS = ["base", "overlays/memmap", "overlays/redis"]
TOKEN = {"token": b"test-token\n", "redis-password": b"test-password\n"}


def manifest_files() -> list[Path]:
    return sorted(
        p
        for p in K8S.rglob("*.yaml")
        if p.name != "kustomization.yaml" and "overlays" not in p.parts
    ) + sorted(K8S.glob("overlays/*/redis.yaml"))


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_file_is_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, VERSION, strict=True)


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_rendered_overlay_is_valid(folder: str) -> None:
    docs = render(K8S / folder, files=TOKEN)
    assert {d["kind"] for d in docs} >= {"StatefulSet", "Service", "PodDisruptionBudget", "Secret"}
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_statefulset_agrees_with_the_cli(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(K8S / folder, files=TOKEN)
    sts = find(docs, "StatefulSet", "tdreplay")
    service = find(docs, "Service", sts["spec"]["serviceName"])
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    # stable names tdreplay-<i>.tdreplay: a headless Service selecting these pods
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pdb = find(docs, "PodDisruptionBudget", "tdreplay")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    (container,) = pod["spec"]["containers"]
    parse_serve(container["args"])
    env = container_env(container)
    ours = {k for k in env if k.startswith("TDREPLAY_")}
    assert ours <= env_vars(), sorted(ours - env_vars())
    assert "TDREPLAY_TOKEN" not in env  # from the Secret's file, never a value here
    token = tmp_path / "token"
    token.write_bytes(TOKEN["token"])
    password = tmp_path / "password"
    password.write_bytes(TOKEN["redis-password"])
    secret_files = {"TDREPLAY_TOKEN_FILE": str(token)}
    if "TDREPLAY_REDIS_PASSWORD_FILE" in env:
        secret_files["TDREPLAY_REDIS_PASSWORD_FILE"] = str(password)
    s = settings_from_env(env, monkeypatch, **secret_files)
    assert s.restore and s.checkpoint_on_shutdown and (s.checkpoint_every or 0) > 0
    assert s.token_bytes == b"test-token" and s.host == "0.0.0.0"

    (port,) = container["ports"]
    assert port["containerPort"] == s.port
    (sport,) = service["spec"]["ports"]
    assert sport["targetPort"] == port["name"] and sport["port"] == s.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert {"/readyz", "/healthz"} <= PUBLIC_PATHS  # probes carry no token
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])

    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert mounts[str(s.root)] in claims  # the data root on the pod's own PVC
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    secret_volume = volumes[mounts[str(Path(env["TDREPLAY_TOKEN_FILE"]).parent)]]
    secret = find(docs, "Secret", secret_volume["secret"]["secretName"])
    assert Path(env["TDREPLAY_TOKEN_FILE"]).name in secret["data"]
    # the socket's folder is the server's own, made in a writable emptyDir: the emptyDir
    # itself is root's, mode 2777, where the server refuses to listen (test_kubernetes_pod)
    assert s.shm_socket is not None and str(s.shm_socket.parent.parent) in mounts
    assert str(s.shm_socket.parent) not in mounts
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    # no API credentials in a pod that never calls the API (the default mounts them)
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"]

    if s.backend == "redis":  # each shard its own database on the Redis Service
        conn = s.redis_connections["default"].describe()
        redis = find(docs, "StatefulSet", "tdreplay-redis")
        rsvc = find(docs, "Service", redis["spec"]["serviceName"])
        assert conn == f"redis://tdreplay-redis-0.{rsvc['metadata']['name']}:6379/0"
        assert rsvc["spec"]["ports"][0]["port"] == 6379
        assert (
            settings_from_env(container_env(container, shard=2), monkeypatch, **secret_files)
            .redis_connections["default"]
            .describe()
            .endswith("/2")
        )
        assert redis["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        (rcontainer,) = redis["spec"]["template"]["spec"]["containers"]
        script = " ".join(rcontainer["args"])
        databases = re.search(r"--databases (\d+)", script)
        assert databases and int(databases.group(1)) > sts["spec"]["replicas"]

        # a password on both sides, from one Secret's file: in no URL, flag or variable
        assert s.redis_connections["default"].kwargs()["password"] == "test-password"
        assert "@" not in env["TDREPLAY_REDIS"]
        path = Path(env["TDREPLAY_REDIS_PASSWORD_FILE"])
        pw_volume = volumes[mounts[str(path.parent)]]["secret"]["secretName"]
        assert path.name in find(docs, "Secret", pw_volume)["data"]
        rmounts = {m["mountPath"]: m["name"] for m in rcontainer["volumeMounts"]}
        rvolumes = {v["name"]: v for v in redis["spec"]["template"]["spec"]["volumes"]}
        assert rvolumes[rmounts[str(path.parent)]]["secret"]["secretName"] == pw_volume
        assert f"requirepass $$(cat {path})" in script  # $$: a literal $ to Kubernetes
        assert str(path) in " ".join(rcontainer["readinessProbe"]["exec"]["command"])


def test_the_renderer_merges_like_kustomize() -> None:
    base = {"a": 1, "l": [{"name": "x", "v": 1}, {"name": "y"}], "p": [1, 2]}
    patch = {"l": [{"name": "x", "v": 2}, {"name": "z"}], "p": [3], "b": 2}
    assert merge(base, patch) == {
        "a": 1,
        "b": 2,
        "l": [{"name": "x", "v": 2}, {"name": "y"}, {"name": "z"}],
        "p": [3],
    }
