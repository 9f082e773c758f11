#!/usr/bin/env bash
# The project's own Docker engine, for building and testing the images (docs/images.md).
#
#   bash hack/docker.sh up     install Debian's docker.io if dockerd is missing (as root), start
#                              a dockerd of our own unless one already answers; idempotent
#   bash hack/docker.sh down   stop the dockerd that `up` started (never anyone else's)
#   bash hack/docker.sh host   print the DOCKER_HOST to use
#   bash hack/docker.sh ours   print the DOCKER_HOST of the project's own engine
#
# A Docker engine that already answers at $DOCKER_HOST (a person's own) is used as it is and
# never stopped. Otherwise ours has its own data root, exec root and socket under
# $MTRL_DOCKER_DIR (default ~/.cache/mtrl/docker), so its image and build cache outlive one run
# and a warm machine rebuilds nothing. It creates no bridge and touches no iptables: builds use
# the host's network (`docker build --network host`), test containers run with `--network none`.
set -euo pipefail

DIR="${MTRL_DOCKER_DIR:-${HOME}/.cache/mtrl/docker}"
SOCK="${DIR}/docker.sock"
PIDFILE="${DIR}/dockerd.pid"
LOG="${DIR}/dockerd.log"
OURS="unix://${SOCK}"
log() { echo "[docker $(date +%T)] $*" >&2; }

# The client that matches Debian's engine (20.10): a newer client on PATH (Docker 23+) routes
# `docker build` through buildx, which Debian's docker.io does not ship.
client() {
  if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi
}

answers() { DOCKER_HOST="$1" "$(client)" version >/dev/null 2>&1; }

running_pid() {
  [ -f "${PIDFILE}" ] || return 1
  local pid; pid=$(cat "${PIDFILE}")
  # A pid file left by a killed engine may name some other process by now.
  [ "$(cat "/proc/${pid}/comm" 2>/dev/null)" = dockerd ] && echo "${pid}"
}

host() {
  if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST}" != "${OURS}" ] && answers "${DOCKER_HOST}"; then
    echo "${DOCKER_HOST}"
  else
    echo "${OURS}"
  fi
}

install_engine() {
  command -v dockerd >/dev/null && [ -x /usr/bin/docker ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "no Docker engine: install one (Debian: apt-get install docker.io) or set DOCKER_HOST" >&2
    exit 1
  fi
  log "installing Debian's docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
}

up() {
  if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST}" != "${OURS}" ] && answers "${DOCKER_HOST}"; then
    log "using the engine at ${DOCKER_HOST}"
    return 0
  fi
  if running_pid >/dev/null && answers "${OURS}"; then return 0; fi
  install_engine
  mkdir -p "${DIR}/data" "${DIR}/exec"
  # What a killed engine left: dockerd refuses to start while its pid file exists, and waits
  # for the containerd its exec root names if that pid is alive. Ours, if it still runs, is
  # stopped; a pid file naming another process (the pid reused) is only removed.
  rm -f "${SOCK}" "${PIDFILE}"
  local cpidfile="${DIR}/exec/containerd/containerd.pid" cpid
  if [ -f "${cpidfile}" ]; then
    cpid=$(cat "${cpidfile}")
    if [ "$(cat "/proc/${cpid}/comm" 2>/dev/null)" = containerd ] \
       && grep -qF "${DIR}/exec" "/proc/${cpid}/cmdline" 2>/dev/null; then
      log "stopping the containerd a killed dockerd left (pid ${cpid})"
      kill -TERM "${cpid}" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "${cpid}" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "${cpidfile}"
  fi
  log "starting dockerd (data root ${DIR}/data)"
  # setsid: the engine outlives the shell that started it (make, pytest), until `down`.
  setsid dockerd --data-root "${DIR}/data" --exec-root "${DIR}/exec" --pidfile "${PIDFILE}" \
    --host "${OURS}" --bridge none --iptables=false --ip-masq=false \
    >"${LOG}" 2>&1 </dev/null &
  local started=$!
  for _ in $(seq 1 120); do
    if answers "${OURS}"; then log "dockerd is up"; return 0; fi
    kill -0 "${started}" 2>/dev/null || break
    sleep 0.5
  done
  echo "dockerd did not start; its log (${LOG}):" >&2
  tail -n 30 "${LOG}" >&2
  exit 1
}

down() {
  local pid
  pid=$(running_pid) || return 0
  log "stopping dockerd (pid ${pid})"
  kill -TERM "${pid}"
  for _ in $(seq 1 60); do
    kill -0 "${pid}" 2>/dev/null || { rm -f "${PIDFILE}"; return 0; }
    sleep 0.5
  done
  log "dockerd did not stop within 30 s; killing it"
  kill -KILL "${pid}" 2>/dev/null || true
  rm -f "${PIDFILE}"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  host) host ;;
  ours) echo "${OURS}" ;;
  client) client ;;
  *) echo "usage: $0 up|down|host|ours|client" >&2; exit 2 ;;
esac
