# The image deploy/ runs: docker build -t shoal:0.1.0 .
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events events
COPY engine engine
COPY shards shards
COPY loadtest loadtest
RUN pip install --no-cache-dir . && useradd --uid 10001 --no-create-home shoal
USER 10001
# the shards' compiled resource kernel is cached here (an emptyDir in deploy/base/shards.yaml)
ENV NUMBA_CACHE_DIR=/tmp/numba-cache
ENTRYPOINT []
CMD ["shoal", "--help"]
