#!/usr/bin/env bash
# Prints a bearer token for the demos' mcadctl and curl: the controller checks every /metrics and /debug request's
# token (TokenReview) and its user's rights (SubjectAccessReview). The ServiceAccount mcad-system/mcad-demo-viewer
# gets the rights of the chart's mcad-debug-viewer and mcad-metrics-reader ClusterRoles (the demos run the
# controller without the chart). Usage: hack/demo-token.sh KUBECONFIG
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kubeconfig=${1:?usage: hack/demo-token.sh KUBECONFIG}
k() { .dev/bin/kubectl --kubeconfig "$kubeconfig" "$@"; }
k apply --server-side --field-manager mcad-demo -f - >/dev/null <<'YAML'
apiVersion: v1
kind: Namespace
metadata: {name: mcad-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mcad-demo-viewer, namespace: mcad-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: mcad-demo-viewer}
rules:
  - nonResourceURLs: [/metrics, /debug/*]
    verbs: [get]
  - apiGroups: [workload.codeflare.dev]
    resources: [appwrappers]
    verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: mcad-demo-viewer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: mcad-demo-viewer}
subjects:
  - {kind: ServiceAccount, name: mcad-demo-viewer, namespace: mcad-system}
YAML
k -n mcad-system create token mcad-demo-viewer --duration 24h
