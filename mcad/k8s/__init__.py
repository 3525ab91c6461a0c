"""Kubernetes I/O: the API client (``mcad.k8s.kube``, the only importer of ``kubernetes``), informers and the work
queue (client-go's machinery), the write pool and what it writes (objects, Events), leader election."""
