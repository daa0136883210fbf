# The tuneloop image: every process of docker-compose.yml runs it with its own command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNELOOP_DATA_DIR=/data

# Wheel installs, not editable: migrations ship inside the server's as tuneloop/_migrations.
# The server depends on the job-side agent's distribution, built from the same checkout.
COPY . /src
RUN pip install /src/agent /src && rm -rf /src

RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin tuneloop \
    && mkdir -p /data && chown tuneloop /data
USER tuneloop
WORKDIR /data

EXPOSE 8000
CMD ["tuneloop", "--help"]
