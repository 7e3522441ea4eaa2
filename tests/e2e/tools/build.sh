#!/usr/bin/env bash
# Build the e2e binaries into ${STRATA_E2E_BIN:-$HOME/.cache/strata/e2e-bin}:
#   control plane   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   nodes           kubelet, kube-proxy, pause (pod sandbox), csi-registrar (registers
#                   a CSI plugin with kubelet), coredns (only the plugins the cluster
#                   uses: its own module in coredns/), and, from their own module at a
#                   pinned version, containerd + containerd-shim-runc-v2 + ctr
#   clients         kubectl, helm, csi-sanity, kstatus (prints the status Argo CD and Flux
#                   compute for an object: its own module in kstatus/)
# The first group and the clients come from the pinned Go module in this folder.
#
# A binary is rebuilt only when its stamp (module version + Go version + the
# go.sum hash, or the pinned version for the others) differs from the one
# recorded beside it. Each step prints how long
# it took. A binary that fails to build is reported with its error and the rest
# are still built; the exit status is non-zero if any failed.
#
# Usage: tests/e2e/tools/build.sh [name ...]   (default: all)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${STRATA_E2E_BIN:-$HOME/.cache/strata/e2e-bin}"
go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { echo "build.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 2; }

export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -mod=mod"
export CGO_ENABLED="${CGO_ENABLED:-0}"
mkdir -p "$bin"
cd "$here"

# name | Go package | module whose version stamps the binary (a folder of this one: the
# hash of its files)
targets=(
  "etcd|./cmd/etcd|go.etcd.io/etcd/server/v3"
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|k8s.io/kubernetes"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|k8s.io/kubernetes"
  "kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler|k8s.io/kubernetes"
  "kubectl|k8s.io/kubernetes/cmd/kubectl|k8s.io/kubernetes"
  "helm|helm.sh/helm/v3/cmd/helm|helm.sh/helm/v3"
  "csi-sanity|github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity|github.com/kubernetes-csi/csi-test/v5"
  "kubelet|k8s.io/kubernetes/cmd/kubelet|k8s.io/kubernetes"
  "kube-proxy|k8s.io/kubernetes/cmd/kube-proxy|k8s.io/kubernetes"
  "pause|./cmd/pause|strata.dev/e2e/tools"
  "csi-registrar|./cmd/csi-registrar|strata.dev/e2e/tools"
  "coredns|.|strata.dev/e2e/tools/coredns"
  "kstatus|.|strata.dev/e2e/tools/kstatus"
)
# Built with `go install <package>@<version>` from their own modules (their go.mod
# files do not mix with Kubernetes' pins): name | package@version | build tags
containerd_version=v2.4.2
containerd_tags="no_btrfs no_devmapper no_zfs no_aufs"
installs=(
  "containerd|github.com/containerd/containerd/v2/cmd/containerd@$containerd_version|$containerd_tags"
  "containerd-shim-runc-v2|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version|$containerd_tags"
  "ctr|github.com/containerd/containerd/v2/cmd/ctr@$containerd_version|$containerd_tags"
)

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(now)
echo "== go mod download"
if ! "$go" mod download; then
  echo "build.sh: go mod download failed" >&2
  exit 1
fi
echo "   $(elapsed "$t0")s"

k8s_version="$("$go" list -m -f '{{.Version}}' k8s.io/kubernetes)"
k8s_minor="$(echo "$k8s_version" | cut -d. -f2)"
sum_hash="$(sha256sum go.sum | cut -c1-16)"
go_version="$("$go" env GOVERSION)"

failed=()
for t in "${targets[@]}"; do
  IFS='|' read -r name pkg mod <<<"$t"
  if [[ $# -gt 0 ]] && [[ " $* " != *" $name "* ]]; then continue; fi
  dir=.
  if [[ "$mod" == strata.dev/e2e/tools/* ]]; then
    dir="${mod#strata.dev/e2e/tools/}"  # a module of its own: its go.mod decides
    version="$(cat "$dir"/go.mod "$dir"/go.sum "$dir"/*.go | sha256sum | cut -c1-16)"
  elif [[ "$mod" == strata.dev/e2e/tools ]]; then
    version="$(cat "${pkg#./}"/*.go | sha256sum | cut -c1-16)"
  else
    version="$("$go" list -m -f '{{.Version}}' "$mod")"
  fi
  stamp="$mod@$version $go_version $sum_hash"
  if [[ -x "$bin/$name" && -f "$bin/$name.stamp" && "$(cat "$bin/$name.stamp")" == "$stamp" ]]; then
    echo "== $name: up to date ($mod@$version)"
    continue
  fi
  ldflags="-s -w"
  if [[ "$mod" == k8s.io/kubernetes ]]; then
    ldflags+=" -X k8s.io/component-base/version.gitVersion=$k8s_version"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
    ldflags+=" -X k8s.io/component-base/version.gitMinor=$k8s_minor"
    ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"
  fi
  if [[ "$mod" == helm.sh/helm/v3 ]]; then
    ldflags+=" -X helm.sh/helm/v3/internal/version.version=$version"
  fi
  echo "== $name ($mod@$version)"
  ts=$(now)
  log="$bin/$name.build.$$.log"
  tmp="$bin/$name.tmp.$$"  # of this run: two runs at once (make test builds helm early) each move their own
  if (cd "$dir" && "$go" build -ldflags "$ldflags" -o "$tmp" "$pkg") >"$log" 2>&1; then
    mv -f "$tmp" "$bin/$name"
    echo "$stamp" >"$bin/$name.stamp"
    rm -f "$log"
    echo "   built in $(elapsed "$ts")s"
  else
    rm -f "$tmp" "$bin/$name.stamp"
    echo "   FAILED after $(elapsed "$ts")s; error (from $log):"
    sed 's/^/   | /' "$log" | tail -20
    failed+=("$name")
  fi
done

for t in "${installs[@]}"; do
  IFS='|' read -r name pkg tags <<<"$t"
  if [[ $# -gt 0 ]] && [[ " $* " != *" $name "* ]]; then continue; fi
  stamp="$pkg tags=$tags $go_version"
  if [[ -x "$bin/$name" && -f "$bin/$name.stamp" && "$(cat "$bin/$name.stamp")" == "$stamp" ]]; then
    echo "== $name: up to date ($pkg)"
    continue
  fi
  echo "== $name ($pkg)"
  ts=$(now)
  log="$bin/$name.build.$$.log"
  gobin="$bin/.install-$name.$$"
  rm -rf "$gobin"
  # Outside this module: its own go.mod decides, so no -mod=mod here.
  if GOFLAGS=-trimpath GOBIN="$gobin" "$go" install -tags "$tags" -ldflags "-s -w" "$pkg" >"$log" 2>&1 \
      && mv -f "$gobin/$(basename "${pkg%@*}")" "$bin/$name"; then
    echo "$stamp" >"$bin/$name.stamp"
    rm -rf "$log" "$gobin"
    echo "   built in $(elapsed "$ts")s"
  else
    rm -rf "$gobin" "$bin/$name.stamp"
    echo "   FAILED after $(elapsed "$ts")s; error (from $log):"
    sed 's/^/   | /' "$log" | tail -20
    failed+=("$name")
  fi
done

echo "== total $(elapsed "$t0")s; binaries in $bin"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "build.sh: failed to build: ${failed[*]}" >&2
  exit 1
fi
