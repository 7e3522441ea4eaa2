#!/usr/bin/env bash
# Build the e2e binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, helm, csi-sanity) from the pinned Go modules in this
# folder into ${STRATA_E2E_BIN:-$HOME/.cache/strata/e2e-bin}.
#
# A binary is rebuilt only when its stamp (module version + Go version + the
# go.sum hash) differs from the one recorded beside it. Each step prints how long
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

# name | Go package | module whose version stamps the binary
targets=(
  "etcd|./cmd/etcd|go.etcd.io/etcd/server/v3"
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|k8s.io/kubernetes"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|k8s.io/kubernetes"
  "kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler|k8s.io/kubernetes"
  "kubectl|k8s.io/kubernetes/cmd/kubectl|k8s.io/kubernetes"
  "helm|helm.sh/helm/v3/cmd/helm|helm.sh/helm/v3"
  "csi-sanity|github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity|github.com/kubernetes-csi/csi-test/v5"
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
  version="$("$go" list -m -f '{{.Version}}' "$mod")"
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
  log="$bin/$name.build.log"
  if "$go" build -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg" >"$log" 2>&1; then
    mv -f "$bin/$name.tmp" "$bin/$name"
    echo "$stamp" >"$bin/$name.stamp"
    rm -f "$log"
    echo "   built in $(elapsed "$ts")s"
  else
    rm -f "$bin/$name.tmp" "$bin/$name.stamp"
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
