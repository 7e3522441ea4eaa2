#!/usr/bin/env bash
# Render manifests/install.yaml from charts/strata: `helm template` with the chart's
# defaults, release `strata` in namespace strata-system, CRDs included, after a Namespace
# object (labelled for the privileged CSI node plugin under Pod Security admission).
# A unit test (tests/unit/chart) fails when the file differs from a fresh render.
#
# Usage: scripts/render-install.sh [OUTPUT]      (default: manifests/install.yaml)
# helm: $HELM, else the e2e build (tests/e2e/tools/build.sh), else helm on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

helm="${HELM:-}"
if [[ -z "$helm" ]]; then
  for candidate in "${STRATA_E2E_BIN:-$HOME/.cache/strata/e2e-bin}/helm" "$(command -v helm || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then helm="$candidate"; break; fi
  done
fi
[[ -n "$helm" ]] || { echo "render-install.sh: no helm: set HELM, or run tests/e2e/tools/build.sh" >&2; exit 2; }

release=strata
namespace=strata-system
# Helm built from source assumes Kubernetes 1.20 unless told; the chart needs 1.25 or newer.
# Nothing in the chart depends on the version beyond that check.
kube_version="${STRATA_KUBE_VERSION:-1.34.0}"
out="${1:-manifests/install.yaml}"
chart_version="$(awk '/^version:/ {print $2}' charts/strata/Chart.yaml)"
app_version="$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' charts/strata/Chart.yaml)"

mkdir -p "$(dirname "$out")"
tmp="$(mktemp "$out.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
{
  cat <<HEADER
# Strata ${app_version}: operator, CRDs, RBAC, locality webhook and CSI driver, in namespace
# ${namespace}. Rendered by scripts/render-install.sh from charts/strata ${chart_version} with its
# default values; do not edit (change the chart and render again).
#
#   kubectl apply --server-side -f manifests/install.yaml
#
# Nothing secret is in this file: the operator makes the webhook's certificate (its own per
# installation) when it first starts.
---
apiVersion: v1
kind: Namespace
metadata:
  name: ${namespace}
  labels:
    app.kubernetes.io/part-of: strata
    # The CSI node plugin runs privileged (FUSE mounts into pods' volumes).
    pod-security.kubernetes.io/enforce: privileged
HEADER
  # --no-hooks: the chart's pre-delete Job deletes every CacheCluster and Mount; applied
  # from a plain file it would run at once.
  "$helm" template "$release" charts/strata --namespace "$namespace" --include-crds --no-hooks \
    --kube-version "$kube_version"
} > "$tmp"
# Keep the file as it is (not even its time) when the render is the same.
if [[ -f "$out" ]] && cmp -s "$out" "$tmp"; then
  echo "$out is current (chart $chart_version, app $app_version)"
  exit 0
fi
mv "$tmp" "$out"
trap - EXIT
echo "rendered $out (chart $chart_version, app $app_version)"
