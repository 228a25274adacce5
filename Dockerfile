# Two images from one file:
#   docker build --target api -t gluejobs-api .        the API (`gluejobs[server]`): no torch, ~200 MB
#   docker build --target worker -t gluejobs-worker .  the training stack (CUDA torch by default)
# A CPU-only worker:
#   docker build --target worker --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
# They share no disk when GLUEJOBS_STORAGE_URL names an S3-compatible store (docker-compose.yml runs
# MinIO); without it, mount the same /data in both (the local folder GLUEJOBS_ARTIFACTS_DIR).

# --- the project's files, once for both images -------------------------------------------------
FROM scratch AS source
COPY pyproject.toml README.md alembic.ini /app/
COPY alembic /app/alembic
COPY shared /app/shared
COPY service /app/service
COPY gluejobs /app/gluejobs
COPY worker /app/worker

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
WORKDIR /app
RUN useradd --create-home --uid 1000 gluejobs && mkdir -p /data && chown gluejobs /data
VOLUME ["/data"]

# --- the API: `pip install gluejobs[server]` (FastAPI, SQLAlchemy, the store, the CLI), no torch -----
FROM runtime AS api
COPY --from=source /app /app
# Editable, so the migrations in /app/alembic sit where shared/migrate.py looks for them.
RUN pip install -e ".[server]"
USER gluejobs
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/healthz').status_code != 200)" || exit 1
CMD ["gluejobs", "serve", "--host", "0.0.0.0", "--port", "8000"]

# --- the worker: `pip install gluejobs[worker]` (the server's stack and the training stack) -----------
FROM runtime AS worker
ARG TORCH_SPEC="torch>=2.2"
ARG TORCH_INDEX_URL=""
# torch first, on its own layer: it is most of the image and changes least.
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
COPY --from=source /app /app
RUN pip install -e ".[worker]"
USER gluejobs
# SIGTERM hands the running job back to the queue: stop it with time to spare (docker stop -t 60).
CMD ["gluejobs", "worker"]
