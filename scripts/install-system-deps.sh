#!/usr/bin/env bash
# Install the Debian packages Strata's tests and demo use, where they are missing.
#   fuse3, attr              FUSE mounts (fusermount3) and xattrs (integration tests, demo)
#   iproute2                 network namespaces, bridges
#   rsync                    the FUSE test of `rsync -a` into a mount
#   runc, containernetworking-plugins, nftables, conntrack, iptables
#                            the e2e cluster's nodes: containerd's runtime, pod networking
#                            (CNI bridge), kube-proxy (nftables mode)
#   podman, buildah, mmdebstrap, uidmap
#                            the e2e images: a Debian base made with mmdebstrap, both
#                            Dockerfiles built with podman (no Docker engine, no registry)
#   cargo-web                Rust (cargo, rustc) for the compiled core, native/, where no
#                            toolchain is on PATH (rustup's or Debian's)
#   prometheus               promtool (the alert rules' unit tests, `promtool check metrics`)
#                            and the Prometheus the e2e suite scrapes the cluster with
set -euo pipefail
need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
have_cmd fusermount3 || need+=(fuse3)
have_cmd ip || need+=(iproute2)
have_cmd getfattr || need+=(attr)
have_cmd rsync || need+=(rsync)
have_cmd promtool || need+=(prometheus)
have_cmd cargo || need+=(cargo-web)
for pkg in runc containernetworking-plugins nftables conntrack iptables podman buildah mmdebstrap uidmap; do
  have_pkg "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
