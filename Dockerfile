# mcad-controller image: slim Python, the package and its dependencies only, running as a non-root user.
# Build: docker build -t ghcr.io/mcad-dev/mcad:0.1.0 .   (the Helm chart's default image)
FROM python:3.11-slim AS build
WORKDIR /src
COPY setup.cfg pyproject.toml LICENSE README.md ./
COPY mcad ./mcad
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# 65532 is the conventional "nonroot" uid; the chart runs the pod with it and a read-only root filesystem.
USER 65532:65532
# PYTHONMALLOC=malloc: memory freed after a burst goes back to the system (see mcad.serve.frontdoor).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONMALLOC=malloc
ENTRYPOINT ["mcad-controller"]
