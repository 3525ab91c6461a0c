#!/usr/bin/env bash
# Local Kubernetes control plane with kwok nodes: `hack/local-cluster.sh up|down|status` (see --help).
exec python3 "$(dirname "${BASH_SOURCE[0]}")/localcluster.py" "$@"
