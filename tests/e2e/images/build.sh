#!/usr/bin/env bash
# Build the e2e cluster's images into ${STRATA_E2E_IMAGES:-$HOME/.cache/strata/e2e-images}
# as image archives (docker-archive format), which the harness imports into each node's containerd:
#   localhost/strata-base:bookworm      Debian 12 (mmdebstrap) with python3 in /opt/venv: the
#                                       base of both Dockerfiles, and the plain Python image
#                                       of test pods (also tagged localhost/python:3.11)
#   localhost/strata-server:e2e         Dockerfile.server   } built unchanged but for their
#   localhost/strata-operator:e2e       Dockerfile.operator } PYTHON_IMAGE build argument
#   localhost/pause:e2e, localhost/coredns:e2e, localhost/csi-registrar:e2e
#                                       one binary each from tests/e2e/tools/build.sh
# No Docker engine or registry: podman builds (runc runtime, host network for pip and apt,
# the host's CA bundle), and pip installs under requirements.lock as constraints.
#
# Each archive's name carries a hash of its inputs (files, build arguments, base image,
# binaries): an archive that exists is up to date, so a warm run builds nothing. Prints each
# step's time. Usage: tests/e2e/images/build.sh [name ...]   (default: all)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${STRATA_E2E_IMAGES:-$HOME/.cache/strata/e2e-images}"
bin="${STRATA_E2E_BIN:-$HOME/.cache/strata/e2e-bin}"
suite=bookworm
mkdir -p "$out"
podman=(podman --runtime=runc --cgroup-manager=cgroupfs --events-backend=file)
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
hash_files() { (cd "$repo" && sha256sum "$@") | sha256sum | cut -c1-16; }
wanted() { [[ ${#selected[@]} -eq 0 ]] || [[ " ${selected[*]} " == *" $1 "* ]]; }
selected=("$@")
t0=$(now)

# Drop older archives of an image once its current one exists.
prune() { find "$out" -maxdepth 1 -name "$1-*.tar" ! -name "$(basename "$2")" -delete; }

# -- base ---------------------------------------------------------------------------------
base_packages="python3,python3-venv,ca-certificates,passwd"
sources=/etc/apt/sources.list.d/debian.sources
[[ -f $sources ]] || sources=/etc/apt/sources.list
base_key="$(printf '%s\n' "$suite" "$base_packages" "$(sed -n '/^# /!p' "$sources")" "$(sed -n '/^# -- base/,/^# -- end base/p' "${BASH_SOURCE[0]}")" | sha256sum | cut -c1-16)"
base_tar="$out/base-$base_key.tar"
base_ref="localhost/strata-base:$base_key"
if [[ ! -f "$base_tar" ]]; then
  echo "== base ($suite: $base_packages)"
  ts=$(now)
  rootfs="$out/.rootfs-$base_key.tar"
  mmdebstrap --quiet --variant=minbase --include="$base_packages" \
    --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
    "$suite" "$rootfs" "$sources"
  "${podman[@]}" import --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$rootfs" "$base_ref" >/dev/null
  rm -f "$rootfs"
  "${podman[@]}" tag "$base_ref" localhost/strata-base:$suite localhost/python:3.11
  "${podman[@]}" save --quiet --multi-image-archive --format docker-archive -o "$base_tar.tmp" localhost/strata-base:$suite localhost/python:3.11
  mv "$base_tar.tmp" "$base_tar"
  prune base "$base_tar"
  echo "   built in $(elapsed "$ts")s"
else
  echo "== base: up to date ($(basename "$base_tar"))"
fi
# -- end base
# Later builds start from the base in podman's store; load it when the store lost it.
"${podman[@]}" image exists "$base_ref" || {
  "${podman[@]}" load -q -i "$base_tar" >/dev/null && "${podman[@]}" tag localhost/strata-base:$suite "$base_ref"; }

# -- the Dockerfiles ------------------------------------------------------------------------
# The build context as .dockerignore lets it through (only these paths), the lock, the base.
context_key="$(cd "$repo" && find pyproject.toml setup.py README.md MANIFEST.in contract cacheserver operator scripts/gen_protos.sh \
  native/Cargo.toml native/Cargo.lock native/src \
  -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*_pb2*.py' ! -name '*_pb2*.pyi' ! -name '*.so' | LC_ALL=C sort)"
pipconf="$out/pip.conf"
printf '[global]\nconstraint = /etc/strata/requirements.lock\n' >"$pipconf"
for image in server operator; do
  wanted "$image" || continue
  key="$(printf '%s\n' "$base_key" "$(hash_files Dockerfile.$image requirements.lock $context_key)" | sha256sum | cut -c1-16)"
  tar="$out/$image-$key.tar"
  if [[ -f "$tar" ]]; then echo "== $image: up to date ($(basename "$tar"))"; continue; fi
  echo "== $image (Dockerfile.$image on $base_ref)"
  ts=$(now)
  # --no-cache: buildah 1.28 mounts nothing for `RUN --mount=from=build` when that stage
  # comes from its layer cache; the archive cache above is what makes warm runs free.
  (cd "$repo" && "${podman[@]}" build --quiet --no-cache --pull=never --network=host \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    -v "$repo/requirements.lock:/etc/strata/requirements.lock:ro" -v "$pipconf:/etc/pip.conf:ro" \
    --build-arg PYTHON_IMAGE="$base_ref" -f Dockerfile.$image -t localhost/strata-$image:e2e .) >/dev/null
  "${podman[@]}" save --quiet --format docker-archive -o "$tar.tmp" localhost/strata-$image:e2e
  mv "$tar.tmp" "$tar"
  prune "$image" "$tar"
  echo "   built in $(elapsed "$ts")s"
done

# -- one-binary images ----------------------------------------------------------------------
for image in pause coredns csi-registrar; do
  wanted "$image" || continue
  [[ -x "$bin/$image" ]] || { echo "images/build.sh: $bin/$image missing: run tests/e2e/tools/build.sh" >&2; exit 1; }
  key="$(sha256sum "$bin/$image" | cut -c1-16)"
  tar="$out/$image-$key.tar"
  if [[ -f "$tar" ]]; then echo "== $image: up to date ($(basename "$tar"))"; continue; fi
  echo "== $image"
  ts=$(now)
  ctx="$(mktemp -d)"
  cp "$bin/$image" "$ctx/$image"
  printf 'FROM scratch\nCOPY %s /%s\nENTRYPOINT ["/%s"]\n' "$image" "$image" "$image" >"$ctx/Containerfile"
  "${podman[@]}" build --quiet --pull=never -f "$ctx/Containerfile" -t "localhost/$image:e2e" "$ctx" >/dev/null
  rm -rf "$ctx"
  "${podman[@]}" save --quiet --format docker-archive -o "$tar.tmp" "localhost/$image:e2e"
  mv "$tar.tmp" "$tar"
  prune "$image" "$tar"
  echo "   built in $(elapsed "$ts")s"
done
echo "== images: $(elapsed "$t0")s; archives in $out"
