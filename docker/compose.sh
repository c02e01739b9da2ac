#!/bin/sh
# Run compose (podman-compose, else docker compose) on compose.yaml with the
# published ports following KINFERENCE_PORT_OFFSET, as `make run` does:
#   KINFERENCE_PORT_OFFSET=100 docker/compose.sh up --build
#   KINFERENCE_BUILD_CA=/etc/ssl/certs/ca-certificates.crt docker/compose.sh build
# KINFERENCE_BUILD_CA: a CA bundle mounted into the build for pip (behind an
# intercepting proxy; podman-compose only, docker: build the image first).
set -eu
cd "$(dirname "$0")/.."
off=${KINFERENCE_PORT_OFFSET:-0}
export KINFERENCE_ROUTER_PORT=$((8080 + off)) KINFERENCE_ADMIN_PORT=$((8081 + off)) KINFERENCE_NATS_PORT=$((4222 + off))
if [ -n "${COMPOSE:-}" ]; then set -- $COMPOSE "$@"
elif command -v podman-compose >/dev/null 2>&1 || [ -x .venv/bin/podman-compose ]; then
  pc=$(command -v podman-compose || echo .venv/bin/podman-compose)
  if [ -n "${KINFERENCE_BUILD_CA:-}" ]; then
    set -- "$pc" "--podman-build-args=-v $KINFERENCE_BUILD_CA:/etc/ssl/host-ca.crt:ro --build-arg PIP_CERT=/etc/ssl/host-ca.crt" "$@"
  else
    set -- "$pc" "$@"
  fi
else set -- docker compose "$@"; fi
echo "router http://127.0.0.1:$KINFERENCE_ROUTER_PORT (admin :$KINFERENCE_ADMIN_PORT, NATS :$KINFERENCE_NATS_PORT)" >&2
exec "$@"
