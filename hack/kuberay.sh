#!/usr/bin/env bash
# KubeRay operator beside the local control plane: `hack/kuberay.sh up|down|status` (see --help).
exec python3 "$(dirname "${BASH_SOURCE[0]}")/kuberay.py" "$@"
