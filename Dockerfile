# syntax=docker/dockerfile:1
# Two images from one file, each installed from the wheels built in its first stage (no source tree,
# nothing editable: what runs is what `pip install` gives a machine):
#   docker build --target api -t gluejobs-api .        the API (`gluejobs-server`): no torch, ~200 MB
#   docker build --target worker -t gluejobs-worker .  the training stack (CUDA torch by default)
# A CPU-only worker: torch from your mirror's copy of PyTorch's CPU index (docs/operators/install.md):
#   docker build --target worker --build-arg TORCH_INDEX_URL="$CPU_TORCH_INDEX" .
# They share no disk when GLUEJOBS_STORAGE_URL names an S3-compatible store (docker-compose.yml runs
# MinIO); without it, mount the same /data in both (the local folder GLUEJOBS_ARTIFACTS_DIR).

# --- the wheels: gluejobs (the client and CLI) and gluejobs-server (API, workers, migrations) ------
FROM python:3.11-slim AS wheels
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py /src/
COPY gluejobs /src/gluejobs
COPY gluejobs_server /src/gluejobs_server
COPY server /src/server
COPY alembic /src/alembic
COPY shared /src/shared
COPY service /src/service
COPY worker /src/worker
RUN pip wheel --no-deps --wheel-dir /wheels . ./server

# --- what both images share ----------------------------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GLUEJOBS_ARTIFACTS_DIR=/data/artifacts \
    GLUEJOBS_DATA_DIR=/data/files \
    GLUEJOBS_MODELS_DIR=/data/models \
    GLUEJOBS_CACHE_DIR=/data/cache \
    HF_HOME=/data/hf
WORKDIR /data
RUN useradd --create-home --uid 1000 gluejobs && mkdir -p /data && chown gluejobs /data
VOLUME ["/data"]

# --- the API: `pip install gluejobs-server` (FastAPI, SQLAlchemy, the store, the CLI), no torch -----
FROM runtime AS api
# The wheels are mounted for the install only: no layer keeps them.
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels pip install --find-links /wheels gluejobs-server
USER gluejobs
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/healthz').status_code != 200)" || exit 1
CMD ["gluejobs", "serve", "--host", "0.0.0.0", "--port", "8000"]

# --- the worker: `pip install "gluejobs-server[worker]"` (the API's stack and the training stack) -----
FROM runtime AS worker
ARG TORCH_SPEC="torch>=2.2"
ARG TORCH_INDEX_URL=""
# torch first, on its own layer: it is most of the image and changes least.
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels pip install --find-links /wheels "gluejobs-server[worker]"
USER gluejobs
# SIGTERM hands the running job back to the queue: stop it with time to spare (docker stop -t 60).
CMD ["gluejobs", "worker"]
