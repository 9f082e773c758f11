#!/usr/bin/env bash
# Builds the three images of images/ on base images made on this machine (docs/images.md).
#
# No container registry is reachable here, so neither `python:3.11-slim` nor PyTorch's CUDA image
# can be pulled. Instead:
#   - mtrl.local/python-base: Debian bookworm (Python 3.11, venv, pip) made by debootstrap from
#     the machine's Debian mirror and `docker import`ed; it trusts the machine's own CAs, so pip
#     works inside builds. Stands in for python:3.11-slim (BASE_IMAGE).
#   - mtrl.local/torch-base: that base with PyPI's torch in a venv on PATH (/opt/torch), as
#     PyTorch's image has it in /opt/conda. Stands in for pytorch/pytorch (TRAINER_BASE_IMAGE).
# Then each Dockerfile is built as it is, with those two build arguments, tagged
# mtrl.local/mtrl-<name>:$MTRL_IMAGE_TAG (default dev).
#
# Everything is cached per machine: the base's root filesystem as a tarball in
# ~/.cache/mtrl/images/ (keyed by a recipe version, the suite, its packages and the machine's
# CAs), torch's wheels in ~/.cache/mtrl/images/wheels-torch-<version>/, and the images and
# their layers in the data root of hack/docker.sh. A warm machine with unchanged sources
# rebuilds nothing. Starts the project's Docker engine (hack/docker.sh up) and leaves it running.
#
#   bash hack/build-images.sh [base] [torch-base] [operator] [worker] [trainer]   (none: all)
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE="bookworm"
BASE_PACKAGES="python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
BASE_RECIPE="1"   # bump when the base's recipe below changes
# The CPU variant's torch is the CUDA base's: the version in the tag of the trainer Dockerfile's
# default base (pytorch/pytorch:<version>-cuda...), so CI resolves the trainer's libraries
# against the torch users get.
TORCH_VERSION="${TORCH_VERSION:-$(sed -n 's|^ARG TRAINER_BASE_IMAGE=pytorch/pytorch:\([0-9.]*\)-.*|\1|p' \
  images/trainer/Dockerfile)}"
[ -n "${TORCH_VERSION}" ] || { echo "no torch version in images/trainer/Dockerfile's base" >&2; exit 1; }
TAG="${MTRL_IMAGE_TAG:-dev}"
CACHE="${MTRL_IMAGE_CACHE:-${HOME}/.cache/mtrl/images}"
IMAGES=(operator worker trainer)
PY="${PYTHON:-.venv/bin/python}"
log() { echo "[build-images $(date +%T)] $*" >&2; }

bash hack/docker.sh up
DOCKER_HOST="$(bash hack/docker.sh host)"
export DOCKER_HOST
DOCKER="$(bash hack/docker.sh client)"
# Debian's engine builds with BuildKit only when asked (RUN --mount needs it).
export DOCKER_BUILDKIT=1
mkdir -p "${CACHE}"
# One build at a time per machine (CI, a person's `make images`, the tests' fixture).
exec 9>"${CACHE}/.lock"
flock 9

# On every image built here, so that clean-up never touches an image of anyone else's.
LABEL="local.mtrl.built-by=hack/build-images.sh"
has_image() { "${DOCKER}" image inspect "$1" >/dev/null 2>&1; }

# The machine's local CAs (its TLS to the package registries goes through one of them).
local_cas() { find /usr/local/share/ca-certificates -name '*.crt' -type f 2>/dev/null | sort; }
ca_key=$(local_cas | xargs -r cat | sha256sum | cut -c1-12)
base_key=$(printf '%s|%s|%s|%s' "${BASE_RECIPE}" "${SUITE}" "${BASE_PACKAGES}" "${ca_key}" \
  | sha256sum | cut -c1-12)
BASE="mtrl.local/python-base:${SUITE}-${base_key}"
TORCH_BASE="mtrl.local/torch-base:${TORCH_VERSION}-${base_key}"

# The machine's Debian mirror, as apt is configured (one-line or deb822 sources).
mirror() {
  local uri
  uri=$(grep -hE '^deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -v -- '-security' | awk '{print $2}' | head -n1 || true)
  if [ -z "${uri}" ]; then
    uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
          | grep -v -- '-security' | awk '{print $2}' | head -n1 || true)
  fi
  [ -n "${uri}" ] || { echo "no Debian mirror in /etc/apt/sources.list*" >&2; exit 1; }
  echo "${uri}"
}

build_base() {
  has_image "${BASE}" && return 0
  local tarball="${CACHE}/python-base-${SUITE}-${base_key}.tar"
  if [ ! -f "${tarball}" ]; then
    command -v debootstrap >/dev/null || {
      log "installing debootstrap"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    local root="${CACHE}/rootfs.tmp"
    rm -rf "${root}"
    log "debootstrap ${SUITE} (${BASE_PACKAGES})"
    debootstrap --variant=minbase --include="${BASE_PACKAGES}" "${SUITE}" "${root}" "$(mirror)" \
      >"${CACHE}/debootstrap.log" 2>&1 || { tail -n 30 "${CACHE}/debootstrap.log" >&2; exit 1; }
    local_cas | while read -r ca; do cp "${ca}" "${root}/usr/local/share/ca-certificates/"; done
    # Quiet: its rehash warns that the bundle holds more than one certificate.
    chroot "${root}" update-ca-certificates >/dev/null 2>&1
    rm -rf "${root}"/var/cache/apt/archives/*.deb "${root}"/var/lib/apt/lists/* "${root}"/tmp/*
    tar -C "${root}" --numeric-owner -cf "${tarball}.tmp" .
    mv "${tarball}.tmp" "${tarball}"
    rm -rf "${root}"
  fi
  log "importing ${BASE}"
  # PIP_CERT: a pip newer than Debian's (the torch base upgrades it) reads certifi's bundle,
  # which lacks the machine's CAs.
  "${DOCKER}" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    -c 'CMD ["python3"]' \
    -c "LABEL ${LABEL}" \
    "${tarball}" "${BASE}" >/dev/null
}

build_torch_base() {
  has_image "${TORCH_BASE}" && return 0
  local wheels="${CACHE}/wheels-torch-${TORCH_VERSION}"
  if [ ! -f "${wheels}/.complete" ]; then
    log "downloading torch ${TORCH_VERSION} and what it requires (PyPI's Linux build: CUDA's wheels come with it)"
    rm -rf "${wheels}" && mkdir -p "${wheels}"
    # This machine is the image's platform (Debian bookworm, CPython 3.11, x86_64).
    "${PY}" -m pip download --quiet --only-binary=:all: -d "${wheels}" "torch==${TORCH_VERSION}" pip
    touch "${wheels}/.complete"
  fi
  log "building ${TORCH_BASE}"
  "${DOCKER}" build --network host --label "${LABEL}" -f hack/torch-base.Dockerfile \
    --build-arg "BASE_IMAGE=${BASE}" \
    --build-arg "TORCH_VERSION=${TORCH_VERSION}" -t "${TORCH_BASE}" "${wheels}"
}

# Arguments name what to build (`base`, `torch-base`, or images); none: everything.
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(base torch-base "${IMAGES[@]}")
wants() { local w; for w in "${want[@]}"; do [ "${w}" = "$1" ] && return 0; done; return 1; }
wants base && build_base
wants torch-base && build_torch_base
for name in "${IMAGES[@]}"; do
  wants "${name}" || continue
  ref="mtrl.local/mtrl-${name}:${TAG}"
  log "building ${ref}"
  start=$(date +%s)
  "${DOCKER}" build --network host --label "${LABEL}" -f "images/${name}/Dockerfile" \
    --build-arg "BASE_IMAGE=${BASE}" --build-arg "TRAINER_BASE_IMAGE=${TORCH_BASE}" \
    -t "${ref}" . >"${CACHE}/build-${name}.log" 2>&1 \
    || { tail -n 40 "${CACHE}/build-${name}.log" >&2; exit 1; }
  log "built ${ref} in $(( $(date +%s) - start ))s"
done

# What an older recipe, torch version or source left behind: bases under other keys, the
# images their tags moved off (dangling), and their cached tarballs and wheels (gigabytes).
for old in $("${DOCKER}" image ls --format '{{.Repository}}:{{.Tag}}' \
             --filter reference=mtrl.local/python-base --filter reference=mtrl.local/torch-base); do
  case "${old}" in "${BASE}"|"${TORCH_BASE}") ;; *) "${DOCKER}" image rm "${old}" >/dev/null ;; esac
done
"${DOCKER}" image prune --force --filter "label=${LABEL}" >/dev/null
# The layers those images had stay in BuildKit's cache (about 1 GB per source change, all of
# an old torch base's): keep the most recently used 2 GB, in our own engine only. The current
# build's records, the most recent, are small (their layers are the images') and stay, so the
# next build is still warm.
if [ "${DOCKER_HOST}" = "$(bash hack/docker.sh ours)" ]; then
  "${DOCKER}" builder prune --force --keep-storage 2GB >/dev/null
fi
find "${CACHE}" -maxdepth 1 \( -name 'python-base-*.tar' -o -name 'wheels-torch-*' \) \
  ! -name "python-base-${SUITE}-${base_key}.tar" ! -name "wheels-torch-${TORCH_VERSION}" \
  -exec rm -rf {} +
