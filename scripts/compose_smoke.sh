#!/usr/bin/env bash
# Manual check of docker-compose.cluster.yml (not part of the test suite: it needs a Docker
# daemon): build the image, start Redis and the two members, check the cluster from the host
# with scripts/compose_smoke_check.py, and tear everything down. Exits non-zero on any failed
# check. See docs/CLUSTER.md ("Checking the compose file").
#
# Where the base images (python:3.11-slim, redis:7-alpine) cannot be pulled (no registry
# reachable), stand-ins are built from Debian bookworm with debootstrap (needs root and a
# Debian mirror) and tagged with the official names: bookworm's python3 is 3.11, and
# redis-server runs the compose file's `redis-server --appendonly yes`. Images already
# present are used as they are.
#
# Environment: COMPOSE (default `docker compose`, else `docker-compose`),
# MODEL_BOSS_SMOKE_PROJECT (compose project name, default model-boss-smoke),
# DEBIAN_MIRROR (default http://deb.debian.org/debian), KEEP=1 leaves the cluster running.
set -euo pipefail
cd "$(dirname "$0")/.."

project=${MODEL_BOSS_SMOKE_PROJECT:-model-boss-smoke}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -n "${COMPOSE:-}" ]; then
  read -r -a compose <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi
compose+=(-p "$project" -f docker-compose.cluster.yml)
export MODEL_BOSS_CLUSTER_SECRET=${MODEL_BOSS_CLUSTER_SECRET:-$(python3 -c \
  'import secrets; print(secrets.token_hex(24))')}

say() { printf '\n== %s\n' "$*" >&2; }

# A bookworm root file system with the given packages; its path on stdout.
bookworm_root() {
  local root
  root=$(mktemp -d /var/tmp/model-boss-standin.XXXXXX)
  debootstrap --variant=minbase --include="$1" bookworm "$root" "$mirror" >&2
  # trust the same local CAs as this host (a TLS-intercepting proxy in front of PyPI)
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
  fi
  echo "$root"
}

# `docker import` a root file system as TAG with the given image settings, then delete it.
import_root() {
  local root=$1 tag=$2
  shift 2
  chroot "$root" apt-get clean
  find "$root"/var/lib/apt/lists -type f -delete
  rm -f "$root"/var/cache/apt/*.bin
  tar -C "$root" -c . | docker import -m "model-boss stand-in for $tag (Debian bookworm)" \
    "$@" - "$tag"
  rm -rf "$root"
}

standin_python() {
  local root
  root=$(bookworm_root python3,python3-venv,ca-certificates,netbase)
  # a venv first on PATH, so `python`, `pip` and installed scripts work as in the official
  # image (whose Python lives in /usr/local); pip there uses the system's CA bundle
  chroot "$root" python3 -m venv /opt/python
  import_root "$root" "$1" \
    --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]'
}

standin_redis() {
  local root
  root=$(bookworm_root redis-server)
  mkdir -p "$root/data"
  # the official image turns protected mode off (clients come from other containers)
  printf '#!/bin/sh\nexec /usr/bin/redis-server "$@" --protected-mode no\n' \
    >"$root/usr/local/bin/redis-server"
  chmod 755 "$root/usr/local/bin/redis-server"
  import_root "$root" "$1" --change 'WORKDIR /data' --change 'EXPOSE 6379' \
    --change 'CMD ["redis-server"]'
}

# The official image if it is here or can be pulled, else the stand-in.
base_image() {
  local tag=$1 build=$2
  if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag: present" >&2
  elif timeout 120 docker pull "$tag" >&2; then
    echo "$tag: pulled" >&2
  else
    say "$tag cannot be pulled: building a Debian bookworm stand-in"
    "$build" "$tag"
  fi
}

say "base images"
base_image python:3.11-slim standin_python
base_image redis:7-alpine standin_redis

down() {
  if [ "${KEEP:-0}" = 1 ]; then
    say "KEEP=1: left running (${compose[*]} down -v to stop)"
    return
  fi
  say "down"
  "${compose[@]}" down -v --remove-orphans
  local label=com.docker.compose.project=$project left
  left=$( { docker ps -aq --filter "label=$label"; docker volume ls -q --filter "label=$label"
            docker network ls -q --filter "label=$label"; } | wc -l)
  if [ "$left" -ne 0 ]; then
    echo "FAIL down left $left containers, volumes or networks of $project" >&2
    exit 1
  fi
  echo "PASS down removed the containers, the volume and the network" >&2
}
trap down EXIT

say "build"
"${compose[@]}" build
say "up"
"${compose[@]}" up -d
"${compose[@]}" ps
say "checks"
if ! python3 scripts/compose_smoke_check.py --compose "${compose[*]}"; then
  say "a check failed; the members' last log lines:"
  "${compose[@]}" logs --tail 40 member-a member-b >&2 || true
  exit 1
fi
