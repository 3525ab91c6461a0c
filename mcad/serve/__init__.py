"""What the controller serves over HTTP: the front door, /metrics, /healthz, /debug, the dashboard, and who may
read them."""
