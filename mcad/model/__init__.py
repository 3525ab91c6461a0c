"""The pure model: decisions over values (capacity, fit, queue order, quota, reservations, status), no threads,
no I/O, no Kubernetes client; everything here can be tested with plain values and a clock."""
