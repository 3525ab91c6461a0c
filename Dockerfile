# mcad-controller image: slim Python, the package and its dependencies only, running as a non-root user.
#   make image                                   docker build with the base below, tagged as the chart expects
#   docker build -t ghcr.io/mcad-dev/mcad:0.1.0 .
# BASE_IMAGE: any image with the layout of the official python:3.11-slim (python3 and pip in /usr/local/bin,
# packages under /usr/local/lib/python3.11/site-packages). Where no registry is reachable, hack/base-image.sh makes
# one from Debian packages and `make image` uses it.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY setup.cfg pyproject.toml LICENSE README.md ./
COPY mcad ./mcad
# --no-compile here, compileall below: the byte code is made once, at build time, for the installed files only,
# since the read-only root filesystem keeps Python from writing it at run time.
# The kubernetes client's asyncio half (kubernetes.aio) and aiohttp with its dependencies are installed by the
# kubernetes package but never imported by it outside kubernetes.aio, nor by mcad: ~80 MB of a ~310 MB image.
# `make image` imports every mcad module in the built image, so a dependency that comes to need them fails there.
RUN pip install --no-cache-dir --no-compile --disable-pip-version-check --prefix=/install . \
 && cd /install/lib/python3.11/site-packages \
 && rm -rf kubernetes/aio aiohttp aiohttp-* aiohttp_retry* aiohappyeyeballs* aiosignal* frozenlist* multidict* \
      yarl* propcache* attr attrs attrs-* */tests \
 && python3 -m compileall -q -j 0 /install/lib

FROM ${BASE_IMAGE}
COPY --from=build /install /usr/local
# 65532 is the conventional "nonroot" uid; the chart runs the pod with it and a read-only root filesystem.
USER 65532:65532
# PYTHONMALLOC=malloc: memory freed after a burst goes back to the system (see mcad.serve.frontdoor).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PYTHONMALLOC=malloc
ENTRYPOINT ["mcad-controller"]
