#!/usr/bin/env bash
# Install the Debian packages Strata's tests and demo use, where they are missing.
set -euo pipefail
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ -e /usr/lib/x86_64-linux-gnu/libfuse3.so.3 ] || ls /usr/lib/*/libfuse3.so.3 >/dev/null 2>&1 || need+=(libfuse3-3)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v getfattr >/dev/null 2>&1 || need+=(attr)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
