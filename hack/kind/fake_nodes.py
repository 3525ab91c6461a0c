#!/usr/bin/env python3
"""The fake nodes of the local control plane, for another cluster: print them as one v1 List (JSON).

Contract (standard library only, like hack/localcluster.py): ``python3 hack/kind/fake_nodes.py [--nodes N
--node-cpu C --node-memory M --node-gpu G --node-pods P]`` writes to stdout exactly the Nodes that
``hack/localcluster.py up`` creates with the same options (and the same NODES, NODE_CPU, NODE_MEMORY, NODE_GPU,
NODE_PODS defaults): ``kwok-node-0`` ... annotated ``kwok.x-k8s.io/node: fake``, with capacity and allocatable
set in their status. hack/e2e-kind.sh pipes it into ``kubectl apply -f -`` so the KinD cluster's kwok manages
the same capacity the suite sees on the local control plane. The node builder is localcluster's own, not a copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script: hack/ is not on the path, hack/kind/ is. localcluster is standard library only.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import localcluster  # after the path it is found on


def main(argv: list[str] | None = None) -> int:
    lc = localcluster
    parser = argparse.ArgumentParser(
        prog="hack/kind/fake_nodes.py",
        description="Print the fake Nodes hack/localcluster.py up creates, as a v1 List, for kubectl apply -f -.")
    lc.add_node_arguments(parser)
    args = parser.parse_args(argv)
    if args.nodes < 0 or args.node_gpu < 0:
        parser.error("--nodes and --node-gpu must be >= 0")
    nodes = lc.fake_nodes(args.nodes, args.node_cpu, args.node_memory, args.node_gpu, args.node_pods)
    json.dump({"apiVersion": "v1", "kind": "List", "items": nodes}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
