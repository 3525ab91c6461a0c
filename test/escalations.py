"""Tenant escalations, as AppWrapper items: what alice (AppWrapper rights only) could get a controller that
creates whatever it is given to create for her. Shared by the admission tests against a real API server
(integration, calling the reviewer) and through the real webhooks (e2e, ``kubectl create``)."""

from __future__ import annotations

from typing import Any

# alice's only rights: AppWrappers in her namespace.
APPWRAPPER_RIGHTS = [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                      "verbs": ["create", "get", "list", "watch", "delete"]}]
# What bob may create besides, so the same items are his to wrap (the denylisted kinds excepted).
BOB_KINDS = [("", "pods"), ("", "secrets"), ("", "services"), ("", "events"), ("", "configmaps"),
             ("apps", "deployments"), ("events.k8s.io", "events")]
# Refused for everyone, whatever their rights (by the ids of ``escalations``).
DENYLISTED = {"sa-token-secret": "Secrets of type kubernetes.io/service-account-token cannot be wrapped",
              "service-externalips": "Services with spec.externalIPs cannot be wrapped",
              "event": "Events cannot be wrapped"}


def appwrapper(namespace: str, name: str, *templates: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"resources": {"GenericItems": [{"generictemplate": t} for t in templates]}}}


def deployment() -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}]}}}}


def privileged_pod() -> dict[str, Any]:
    """Runs as the namespace admin ``deployer``, privileged, on the host's PID and network namespaces, with the host's
    root mounted and a Secret alice cannot read in its environment."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"}, "spec": {
        "serviceAccountName": "deployer", "hostPID": True, "hostNetwork": True,
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True},
                        "resources": {"requests": {"cpu": "10m"}},
                        "envFrom": [{"secretRef": {"name": "db-credentials", "optional": True}}],
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}]}]}}


def token_secret() -> dict[str, Any]:
    """A non-expiring token of ``deployer``, which the token controller would fill in."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "deployer-token", "annotations": {"kubernetes.io/service-account.name": "deployer"}}}


def external_service() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"},
            "spec": {"ports": [{"port": 53}], "externalIPs": ["8.8.8.8"]}}


def kubelet_event() -> dict[str, Any]:
    """An Event posing as the kubelet (the controller's own right to create Events)."""
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "forged"}, "reason": "Started",
            "message": "looks legit", "involvedObject": {"kind": "Pod", "name": "x"},
            "source": {"component": "kubelet"}}


# (template, the item as messages name it, its resource as a refusal names it, id)
ESCALATIONS = [
    (deployment, "Deployment web", "deployments.apps", "deployment"),
    (privileged_pod, "Pod root", "pods", "privileged-pod-as-deployer"),
    (token_secret, "Secret deployer-token", "secrets", "sa-token-secret"),
    (external_service, "Service dns", "services", "service-externalips"),
    (kubelet_event, "Event forged", "events", "event"),
]
