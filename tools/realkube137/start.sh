#!/usr/bin/env bash
# Start a fresh etcd + kube-apiserver v1.37 on 127.0.0.1, or stop one (both built by
# build.sh beside this file into $RK).
#   start.sh up   RUN_DIR   -> etcd + apiserver, fresh data; writes RUN_DIR/{pids,admin.kubeconfig,url}
#   start.sh down RUN_DIR   -> stop exactly the PIDs recorded in RUN_DIR/pids
# Binaries under $RK (./dev kube build). Ports: $API_PORT, $ETCD_PORT, $ETCD_PEER,
# $ETCD_METRICS (free ones are picked by ./dev kube up and the tests). $AUTHZ: AlwaysAllow
# (default) or RBAC. A token with system:masters: admin-token-0123456789; tokens for the
# binder, ingest and coordinator ServiceAccounts' users are in RUN_DIR/tokens.csv too.
# Kubernetes' own pod groups are served: scheduling.k8s.io/v1beta1 Workload and PodGroup
# (feature gate GenericWorkload, beta and off by default in 1.37, and the beta API version).
set -euo pipefail
RK=${RK:?RK: the cache directory the binaries were built in}
cmd=${1:-}; RUN=${2:-$RK/run}
ETCD_PORT=${ETCD_PORT:-2379}; ETCD_PEER=${ETCD_PEER:-2380}; API_PORT=${API_PORT:-6443}
ETCD_METRICS=${ETCD_METRICS:-$((ETCD_PORT + 2))}; AUTHZ=${AUTHZ:-AlwaysAllow}

certs() {  # CA, serving cert for 127.0.0.1/localhost, service-account key, tokens
  local C=$RK/pki
  [[ -f $C/tokens.csv ]] && return 0
  mkdir -p "$C.tmp.$$" && cd "$C.tmp.$$"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=realkube-ca -keyout ca.key -out ca.crt 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key -out apiserver.csr 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.0.0.1\n' > san.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile san.ext -out apiserver.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  touch tokens.csv   # a marker of a whole set: the tokens are written by each start
  cd - >/dev/null
  mv "$C.tmp.$$" "$C" 2>/dev/null || rm -rf "$C.tmp.$$"   # another start made them first
}

wait_ready() {
  for _ in $(seq 1 240); do
    if curl -fsS --cacert "$RK/pki/ca.crt" -H 'Authorization: Bearer admin-token-0123456789' \
        "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then return 0; fi
    for pid in $(awk '{print $2}' "$RUN/pids"); do
      kill -0 "$pid" 2>/dev/null || { echo "error: a process exited; see $RUN/*.log" >&2; tail -5 "$RUN"/apiserver.log >&2; return 1; }
    done
    sleep 0.5
  done
  echo "error: apiserver not ready after 120 s; see $RUN/apiserver.log" >&2; return 1
}

ETCD=$RK/bin/etcd
# (--endpoint-reconciler-type=none below: v1.37 refuses a loopback address for the
# endpoints of the kubernetes Service)
case $cmd in
up)
  [[ -x $RK/bin/kube-apiserver ]] || { echo "error: no kube-apiserver under $RK: run ./dev kube build" >&2; exit 2; }
  certs
  rm -rf "$RUN" && mkdir -p "$RUN"
  {
    echo 'admin-token-0123456789,admin,admin,"system:masters"'
    for sa in binder ingest coordinator; do
      echo "$sa-token-0123456789,system:serviceaccount:shoal:shoal-$sa,$sa,\"system:serviceaccounts,system:serviceaccounts:shoal\""
    done
  } > "$RUN/tokens.csv"
  "$ETCD" --name default --data-dir "$RUN/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER" --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS" \
    > "$RUN/etcd.log" 2>&1 &
  echo "etcd $!" >> "$RUN/pids"
  "$RK/bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --secure-port="$API_PORT" --advertise-address=127.0.0.1 \
    --tls-cert-file="$RK/pki/apiserver.crt" --tls-private-key-file="$RK/pki/apiserver.key" \
    --client-ca-file="$RK/pki/ca.crt" --token-auth-file="$RUN/tokens.csv" \
    --authorization-mode="$AUTHZ" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$RK/pki/sa.pub" --service-account-signing-key-file="$RK/pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --disable-admission-plugins=ServiceAccount,TaintNodesByCondition \
    --cert-dir="$RUN/certs" --v=1 \
    --feature-gates=GenericWorkload=true --runtime-config=scheduling.k8s.io/v1beta1=true \
    --endpoint-reconciler-type=none \
    > "$RUN/apiserver.log" 2>&1 &
  echo "apiserver $!" >> "$RUN/pids"
  cat > "$RUN/admin.kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: realkube
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$RK/pki/ca.crt"}
users:
- name: admin
  user: {token: admin-token-0123456789}
contexts:
- name: realkube
  context: {cluster: realkube, user: admin}
current-context: realkube
EOK
  echo "https://127.0.0.1:$API_PORT" > "$RUN/url"
  wait_ready
  echo "apiserver ready: KUBECONFIG=$RUN/admin.kubeconfig"
  ;;
down)
  if [[ -f $RUN/pids ]]; then
    tac "$RUN/pids" | while read -r name pid; do
      kill "$pid" 2>/dev/null && echo "stopped $name $pid" || true
    done
    # GRACE: seconds to wait for a clean exit before SIGKILL (default 10; the tests,
    # whose servers' data is thrown away, give 1)
    for _ in $(seq 1 $(( ${GRACE:-10} * 2 ))); do
      alive=0
      while read -r _ pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$RUN/pids"
      [[ $alive == 0 ]] && break
      sleep 0.5
    done
    while read -r _ pid; do kill -9 "$pid" 2>/dev/null || true; done < "$RUN/pids"
    rm -f "$RUN/pids"
  fi
  ;;
*) echo "usage: $0 up|down RUN_DIR" >&2; exit 2;;
esac
