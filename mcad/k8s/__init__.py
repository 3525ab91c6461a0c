"""Kubernetes I/O: the API client (``mcad.k8s.kube``, the only importer of ``kubernetes``), informers, the write
pool and what it writes (objects, Events), leader election."""
