# One image for both roles: `gluejobs serve` (the API) and `gluejobs worker` (needs a GPU for speed,
# runs on CPU too). Build a CPU-only image with:
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t gluejobs .
FROM python:3.11-slim

ARG TORCH_SPEC="torch>=2.2"
ARG TORCH_INDEX_URL=""

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GLUEJOBS_ARTIFACTS_DIR=/data/artifacts \
    GLUEJOBS_DATA_DIR=/data/files \
    GLUEJOBS_MODELS_DIR=/data/models \
    GLUEJOBS_CACHE_DIR=/data/cache \
    HF_HOME=/data/hf

WORKDIR /app
# torch first, on its own layer: it is most of the image and changes least.
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"

COPY pyproject.toml README.md alembic.ini ./
COPY alembic ./alembic
COPY shared ./shared
COPY service ./service
COPY worker ./worker
# Editable, so the migrations in /app/alembic sit where shared/migrate.py looks for them.
RUN pip install -e ".[demo]" && useradd --create-home --uid 1000 gluejobs && mkdir -p /data \
    && chown gluejobs /data
USER gluejobs
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:8000/healthz').status_code != 200)" || exit 1
CMD ["gluejobs", "serve", "--host", "0.0.0.0", "--port", "8000"]
