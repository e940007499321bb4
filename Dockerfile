# One image for the controller, the workers and the dashboard (see compose.yaml):
#
#   docker build -t queueworks .                                        # + dashboard extra
#   docker build -t queueworks:torch --build-arg EXTRAS=dashboard,torch .  # + torch (CPU)
#   docker build -t queueworks --build-arg PIP_OPTIONS="--no-index --find-links /src/wheels" .
#                                     # offline, from a wheelhouse in wheels/ (docs/deploy.md)
#
# No `# syntax=` line on purpose: BuildKit would fetch that frontend image from a registry,
# which an air-gapped build cannot reach; nothing here needs more than the built-in syntax.
# The package is installed with `pip install .` into a virtualenv in a build stage; the
# runtime stage copies only that virtualenv and runs as an unprivileged user.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# pip extras to install: "dashboard" (starlette/uvicorn for `queueworks dashboard`), "torch"
# (elastic data-parallel training); comma-separated, empty for the bare package.
ARG EXTRAS=dashboard
# Where torch comes from when the torch extra is asked for: the CPU-only wheels by default
# (hundreds of MB instead of GBs of CUDA libraries); set it empty to take PyPI's build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# More options for the `pip install`s, word-split: empty = the package index as usual. With no
# index reachable, fill wheels/ beforehand (`pip download --dest wheels '.[dashboard]'
# setuptools`, see docs/deploy.md) and pass "--no-index --find-links /src/wheels".
ARG PIP_OPTIONS=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/queueworks
WORKDIR /src
COPY pyproject.toml ./
# the wheelhouse (only its README unless you filled it); this stage is not in the final image
COPY wheels ./wheels
# Dependencies first, from pyproject.toml alone: the package's directories (made empty here,
# from pyproject's package list) are not there yet
# and README.md (its long description) is a placeholder, so this installs the dependencies
# and an empty queueworks, in a layer that a change to the sources or docs leaves cached.
RUN set -eu; \
    touch README.md; \
    python -c 'import pathlib, tomllib; \
t = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]; \
where = t.get("package-dir", {}); \
[pathlib.Path(where.get(p, p.replace(".", "/"))).mkdir(parents=True, exist_ok=True) \
 for p in t["packages"]]'; \
    spec="."; \
    if [ -n "${EXTRAS}" ]; then spec=".[${EXTRAS}]"; fi; \
    case ",${EXTRAS}," in \
      *,torch,*) if [ -n "${TORCH_INDEX_URL}" ]; then export PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}"; fi ;; \
    esac; \
    /opt/queueworks/bin/pip install ${PIP_OPTIONS} "${spec}"
COPY README.md ./
COPY queueworks ./queueworks
COPY controller ./controller
COPY workers ./workers
RUN /opt/queueworks/bin/pip install ${PIP_OPTIONS} --no-deps --force-reinstall . \
 && /opt/queueworks/bin/queueworks --version

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="queueworks" \
      org.opencontainers.image.description="Elastic work-queue on Redis Streams: controller, worker and dashboard" \
      org.opencontainers.image.licenses="MIT"
RUN groupadd --system --gid 10001 queueworks \
 && useradd --system --uid 10001 --gid queueworks --create-home --home-dir /home/queueworks \
      --shell /usr/sbin/nologin queueworks
COPY --from=build /opt/queueworks /opt/queueworks
ENV PATH=/opt/queueworks/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/queueworks
# docker stop / compose scale-down send SIGTERM: workers leave their node set, controllers
# release the leader lease, then exit (compose.yaml gives them a stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["queueworks", "--help"]
