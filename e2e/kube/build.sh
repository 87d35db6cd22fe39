#!/usr/bin/env bash
# Builds the pinned control-plane binaries from the Go module proxy (see RECIPE.md) into
# e2e/.tools/kube/v1.36.5/, once: kube-apiserver, kube-controller-manager, kube-scheduler
# (k8s.io/kubernetes v1.36.5 with its staging modules pinned in k8s-bins/go.mod), etcd
# (go.etcd.io/etcd/server/v3 v3.6.8, etcd-bin/go.mod) and kwok (sigs.k8s.io/kwok v0.8.0); and
# cert-manager's CRDs, as its module github.com/cert-manager/cert-manager v1.21.2 ships them.
# Cold, on two cores, this takes about half an hour; later runs find the binaries and return.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
V=v1.36.5
BIN="$root/e2e/.tools/kube/$V"
mkdir -p "$BIN"
export CGO_ENABLED=0

if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  PKG=k8s.io/component-base/version
  CPKG=k8s.io/client-go/pkg/version
  LDF="-s -w"
  for p in $PKG $CPKG; do
    LDF="$LDF -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=36 -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$BIN/$c" ] && continue
    echo "building $c"
    (cd "$here/k8s-bins" && go build -buildvcs=false -trimpath -tags selinux,notest,grpcnotrace \
      -ldflags "$LDF" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c" && mv "$BIN/$c.tmp" "$BIN/$c")
  done
fi
if [ ! -x "$BIN/etcd" ]; then
  echo "building etcd"
  (cd "$here/etcd-bin" && go build -buildvcs=false -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" \
    go.etcd.io/etcd/server/v3 && mv "$BIN/etcd.tmp" "$BIN/etcd")
fi
if [ ! -x "$BIN/kwok" ]; then
  echo "building kwok"
  GOBIN="$BIN" go install -trimpath sigs.k8s.io/kwok/cmd/kwok@v0.8.0
fi
CERT_MANAGER=v1.21.2
if [ ! -f "$BIN/cert-manager-crds.yaml" ]; then
  echo "fetching cert-manager $CERT_MANAGER's CRDs"
  # Outside any module: only the module's files are fetched, nothing is built.
  (cd "$(mktemp -d)" && go mod download "github.com/cert-manager/cert-manager@$CERT_MANAGER")
  crds="$(go env GOMODCACHE)/github.com/cert-manager/cert-manager@$CERT_MANAGER/deploy/crds"
  for kind in certificates certificaterequests issuers clusterissuers; do
    cat "$crds/cert-manager.io_$kind.yaml"
  done >"$BIN/cert-manager-crds.yaml.tmp"
  mv "$BIN/cert-manager-crds.yaml.tmp" "$BIN/cert-manager-crds.yaml"
fi
ls -la "$BIN"
