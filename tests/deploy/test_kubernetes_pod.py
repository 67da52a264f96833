"""The StatefulSet's pod on a real Docker engine, its volumes made as the kubelet makes them.

No cluster here: the rendered memmap overlay's container runs as its ``securityContext`` says
(``runAsUser``/``runAsGroup``, ``fsGroup`` as a supplementary group, read-only root, every
capability dropped, no privilege escalation), with its ``env`` and ``args``, and each volume
as Kubernetes hands it over: an ``emptyDir`` is a folder of root's with mode 2777 (0777, and
``fsGroup``'s group set on it), a PersistentVolumeClaim root's with mode 2775, a Secret's file
``defaultMode`` in ``fsGroup``'s group. A sidecar in the same pod (its network, the ``run``
emptyDir) reaches the server over the same-host socket. ``make test-deploy`` runs it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from deploykit import REPO
from dockerkit import PREFIX, cleanup, docker, free_port, wait_ready
from kustomize import container_env, find, render

pytestmark = pytest.mark.docker

SIDECAR = """
from tdreplay.client import ReplayClient
with ReplayClient() as client:  # TDREPLAY_URL and TDREPLAY_TOKEN_FILE from the environment
    print(client.transport, client.info("cartpole")["size"])
"""


@dataclass
class Pod:
    name: str
    container: dict[str, Any]
    security: dict[str, Any]
    env: dict[str, str]
    volumes: dict[str, str] = field(default_factory=dict)  # pod volume name -> docker volume

    def user(self) -> list[str]:
        s = self.security
        return ["--user", f"{s['runAsUser']}:{s['runAsGroup']}", "--group-add", str(s["fsGroup"])]

    def mounts(self, *but: str) -> list[str]:
        """``--volume`` arguments for the container's mounts (but the mount paths ``but``)."""
        args = []
        for m in self.container["volumeMounts"]:
            if m["mountPath"] in but:
                continue
            # nocopy: as the kubelet's, not filled (nor chowned) from the image's folder
            ro = ",ro" if m.get("readOnly") else ""
            args += ["--volume", f"{self.volumes[m['name']]}:{m['mountPath']}:nocopy{ro}"]
        return args


def kubelet_volume(
    image: str, name: str, mode: str, group: int, files: dict[str, tuple[str, str]]
) -> None:
    """A Docker volume as the kubelet hands the pod's volume over: root's, in ``group``, with
    ``files`` (name -> text, mode)."""
    docker("volume", "create", name)
    writes = "".join(
        f"printf %s {json.dumps(text)} > /v/{path} && chown 0:{group} /v/{path} && "
        f"chmod {file_mode} /v/{path} && "
        for path, (text, file_mode) in files.items()
    )
    docker(
        "run", "--rm", "--network", "none", "--user", "0", "--volume", f"{name}:/v",
        "--entrypoint", "sh", image, "-c", f"{writes}chown 0:{group} /v && chmod {mode} /v",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pod(image: str) -> Iterator[Pod]:
    token = secrets.token_hex(16)
    docs = render(REPO / "deploy/kubernetes/overlays/memmap", files={"token": token.encode()})
    spec = find(docs, "StatefulSet", "tdreplay")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    security = spec["securityContext"]
    p = Pod(f"{PREFIX}-pod", container, security, container_env(container))
    group = security["fsGroup"]
    kinds = {v["name"]: v for v in spec["volumes"]}
    port = free_port()
    try:
        for mount in container["volumeMounts"]:
            volume = p.volumes[mount["name"]] = f"{PREFIX}-pod-{mount['name']}"
            source = kinds.get(mount["name"], {})
            if "secret" in source:
                files = {"token": (token, f"{source['secret']['defaultMode']:o}")}
                kubelet_volume(image, volume, "2755", group, files)
            elif "emptyDir" in source:
                kubelet_volume(image, volume, "2777", group, {})
            else:  # the PersistentVolumeClaim of volumeClaimTemplates
                kubelet_volume(image, volume, "2775", group, {})
        env = [a for k, v in p.env.items() for a in ("--env", f"{k}={v}")]
        docker(
            "run", "--detach", "--name", p.name, *p.user(), *p.mounts(), *env,
            "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--publish", f"127.0.0.1:{port}:{container['ports'][0]['containerPort']}",
            image, *container["args"],
        )  # fmt: skip
        wait_ready(f"http://127.0.0.1:{port}", p.name)
        yield p
    finally:
        cleanup("container", [p.name])
        cleanup("volume", list(p.volumes.values()))


def test_the_pod_starts_and_a_sidecar_gets_shared_memory(pod: Pod, image: str) -> None:
    env = ["--env", f"TDREPLAY_URL=http://127.0.0.1:{pod.env['TDREPLAY_PORT']}"]
    env += ["--env", f"TDREPLAY_TOKEN_FILE={pod.env['TDREPLAY_TOKEN_FILE']}"]
    mounts = pod.mounts(pod.env["TDREPLAY_ROOT"])  # the run emptyDir and the token, not the PVC
    out = docker(
        "run", "--rm", "--network", f"container:{pod.name}", *pod.user(), *mounts, *env,
        "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--entrypoint", "python", image, "-c", SIDECAR,
    )  # fmt: skip
    assert out.splitlines()[-1] == "shm 0", out
