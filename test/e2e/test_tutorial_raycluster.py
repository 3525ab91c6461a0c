"""docs/tutorial.md, run: ray.io/v1 RayClusters wrapped in AppWrappers, with the real KubeRay operator.

The YAML the page shows must be the content of the sample files it names (``<!-- file: PATH -->`` before each
block), and the files it creates with ``kubectl create -f`` are exactly those, in that order. The test then does what
the page says, with kubectl and mcadctl, and checks each outcome it claims: the first RayCluster's head and worker
Running, the second Pending with no RayCluster and no pod, ``mcadctl --offline explain`` saying why, and the second
dispatched (RayCluster created, head and worker Running) once the first AppWrapper is deleted.

The page asks for a cluster with room for one RayCluster (3 cpu) but not two: the free cpu is first filled down to
4 cores, as test_seed_raycluster.py does, so exactly one fits whatever the size of the test cluster. The page's
commands use the current namespace; here they get the test's namespace (``-n``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client as k8s

from test.e2e.conftest import AppWrappers, Controller, appwrapper, blocked_on, deployment_item, free_cpu_millis
from test.support import REPO, wait_until

TUTORIAL = REPO / "docs" / "tutorial.md"
_SHOWN = re.compile(r"^<!-- file: (\S+) -->\n```yaml\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_CREATED = re.compile(r"^kubectl create -f (\S+)$", re.MULTILINE)
RAY_V1 = "ray.io/v1"


def shown_files(page: str) -> list[tuple[str, str]]:
    """(path, YAML shown) for each file the page shows."""
    return [(path, text) for path, text in _SHOWN.findall(page)]


def kubectl(kubeconfig: str, *args: str) -> str:
    binary = shutil.which("kubectl") or str(REPO / ".dev" / "bin" / "kubectl")
    result = subprocess.run([binary, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60,
                            check=False, cwd=REPO)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def mcadctl(kubeconfig: str, *args: str) -> str:
    result = subprocess.run([str(Path(sys.executable).parent / "mcadctl"), "--kubeconfig", kubeconfig, *args],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def ray_pods(core: k8s.CoreV1Api, namespace: str, cluster: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={cluster}").items
            if p.status.phase == "Running"]


def head_and_worker(core: k8s.CoreV1Api, namespace: str, cluster: str) -> list[Any]:
    def both() -> list[Any] | None:
        pods = ray_pods(core, namespace, cluster)
        return pods if sorted(p.metadata.labels.get("ray.io/node-type") for p in pods) == ["head", "worker"] \
            else None

    return wait_until(both, 90, f"the head and worker of RayCluster {cluster} Running")


def row(table: str, name: str) -> str:
    """The line of ``kubectl get`` output that names ``name``."""
    return next(line for line in table.splitlines() if line.split()[:1] == [name])


def test_the_page_shows_the_sample_files_it_creates() -> None:
    page = TUTORIAL.read_text()
    shown = shown_files(page)
    assert [path for path, _ in shown] == ["config/samples/raycluster-v1-a.yaml",
                                           "config/samples/raycluster-v1-b.yaml"]
    for path, text in shown:
        assert (REPO / path).read_text() == text, f"docs/tutorial.md shows {path} other than it is"
    assert _CREATED.findall(page) == [path for path, _ in shown]


def test_the_shown_yaml_check_reports_a_difference() -> None:
    page = TUTORIAL.read_text().replace("image: rayproject/ray:2.41.0", "image: rayproject/ray:2.40.0", 1)
    path, text = shown_files(page)[0]
    assert (REPO / path).read_text() != text


def test_tutorial_second_raycluster_waits_with_nothing_created_until_the_first_is_deleted(
        kuberay_operator: None, controller: Controller, aws: AppWrappers, core: k8s.CoreV1Api,
        kubeconfig: str) -> None:
    namespace = aws.namespace
    filler = free_cpu_millis(core) - 4000
    assert filler >= 0, "the test cluster needs at least 4 free cpu"
    if filler:
        aws.create(appwrapper("filler", deployment_item("filler", 1, f"{filler}m")))
        aws.wait_pods("filler", 1)
    first, second = (path for path, _ in shown_files(TUTORIAL.read_text()))
    # 2. The free room, as the page has the reader read it: 4 cpu, room for one RayCluster and not two.
    ledger = json.loads(mcadctl(kubeconfig, "--offline", "ledger", "-o", "json"))
    assert {r["name"]: r["free"] for r in ledger["resources"]}["cpu"] == "4", ledger["resources"]

    # 3. The first RayCluster: dispatched at once, KubeRay makes its head and worker.
    kubectl(kubeconfig, "create", "-n", namespace, "-f", first)
    aws.wait_state("raycluster-a", "Running")
    assert aws.exists(RAY_V1, "RayCluster", "raycluster-a")
    for pod in head_and_worker(core, namespace, "raycluster-a"):
        assert pod.metadata.labels["workload.codeflare.dev/appwrapper"] == "raycluster-a"
    listed = row(kubectl(kubeconfig, "get", "appwrappers", "-n", namespace), "raycluster-a")
    assert listed.split()[1] == "Running", listed

    # 4. The second waits, and nothing of it exists.
    kubectl(kubeconfig, "create", "-n", namespace, "-f", second)
    queued = aws.wait_state("raycluster-b", "Pending")
    assert queued["conditions"][-1]["type"] == "Backoff"
    assert blocked_on(queued["message"], "cpu"), queued["message"]
    assert "RayCluster raycluster-b" in queued["message"]
    listed = row(kubectl(kubeconfig, "get", "appwrappers", "-n", namespace), "raycluster-b")
    assert listed.split()[1] == "Pending" and "RayCluster raycluster-b" in listed, listed
    rayclusters = kubectl(kubeconfig, "get", "rayclusters", "-n", namespace)
    assert "raycluster-a" in rayclusters and "raycluster-b" not in rayclusters, rayclusters
    assert not aws.exists(RAY_V1, "RayCluster", "raycluster-b")
    assert aws.pods("raycluster-b") == [] and ray_pods(core, namespace, "raycluster-b") == []
    explained = mcadctl(kubeconfig, "--offline", "explain", f"{namespace}/raycluster-b")
    assert explained.startswith(f"{namespace}/raycluster-b [Pending]: "), explained
    assert blocked_on(explained, "cpu"), explained

    # 5. Deleting the first frees its room: the second is dispatched and KubeRay starts it.
    kubectl(kubeconfig, "delete", "-n", namespace, "appwrapper", "raycluster-a")
    aws.wait_state("raycluster-b", "Running", timeout=120)
    assert aws.exists(RAY_V1, "RayCluster", "raycluster-b")
    head_and_worker(core, namespace, "raycluster-b")
    wait_until(lambda: not aws.exists(RAY_V1, "RayCluster", "raycluster-a"), 60,
               "the first RayCluster deleted with its AppWrapper")
