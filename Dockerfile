# syntax=docker/dockerfile:1
# mixgate: gateway + in-process engine. Slim CPU image by default:
#   docker build -t mixgate:cpu .
# CUDA build: PyPI's Linux torch wheel is the CUDA build (its CUDA libraries come as wheels,
# the driver from the NVIDIA container toolkit):
#   docker build -t mixgate:cuda --build-arg TORCH_INDEX=https://pypi.org/simple .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# gcc: the engine compiles its C kernels on first start, for the CPU it runs on
# (engine/model/kernels/); without it decode attention falls back to torch's slower path.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# NOTE: torch first and pinned, from TORCH_INDEX: an unpinned torch can pull a multi-GB CUDA build.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY mixgate ./mixgate
COPY engine ./engine
COPY gateway ./gateway
COPY policies ./policies
COPY planning ./planning
COPY bench ./bench
RUN pip install . && rm -rf /src

# Non-root; /data (models made on first run) is owned by it, so a fresh named volume is too.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin mixgate \
    && mkdir /data && chown mixgate:mixgate /data
USER mixgate
WORKDIR /home/mixgate

ENV MIXGATE_DATA_DIR=/data \
    MIXGATE_PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# The slim image has no curl: urlopen raises (exit 1) on 503 until the engine has warmed up.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]

# SIGTERM drains (stops claiming, finishes or hands back in-flight work) and exits 0.
STOPSIGNAL SIGTERM
CMD ["mixgate", "serve", "--host", "0.0.0.0"]
