#!/usr/bin/env bash
# Starts a real Kubernetes control plane on loopback for the e2e tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (which simulates a node and makes scheduled
# pods Running and Ready; no containers run). Binaries come from build.sh.
#
# Usage: source e2e/kube/up.sh WORKDIR    (exports KUBECONFIG; `kube_down` stops everything)
set -euo pipefail
_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_root="$(cd "$_here/../.." && pwd)"
W="$(realpath -m "${1:?usage: source up.sh WORKDIR}")"
BIN="$_root/e2e/.tools/kube/v1.36.5"
"$_here/build.sh" >/dev/null
mkdir -p "$W/pki" "$W/logs"
P="$W/pki"
KUBE_PIDS=()

# Throwaway processes: SIGKILL (a graceful apiserver waits on its clients' open watches).
kube_down() {
  for ((i = ${#KUBE_PIDS[@]} - 1; i >= 0; i--)); do kill -9 "${KUBE_PIDS[$i]}" 2>/dev/null || true; done
  for pid in "${KUBE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  KUBE_PIDS=()
}

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# A CA, the apiserver's serving certificate, an admin client certificate, the SA key pair.
(
  cd "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=e2e-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out apiserver.crt \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc,IP:10.96.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n') 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=e2e-admin" 2>/dev/null
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out admin.crt \
    -extfile <(printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n') 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)

ETCD_CLIENT="$(free_port)"
ETCD_PEER="$(free_port)"
API_PORT="$(free_port)"
cat >"$W/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: $P/ca.crt}}]
users: [{name: admin, user: {client-certificate: $P/admin.crt, client-key: $P/admin.key}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
EOF
export KUBECONFIG="$W/admin.kubeconfig"

"$BIN/etcd" --name=e2e --data-dir="$W/etcd" --unsafe-no-fsync \
  --listen-client-urls="http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls="http://127.0.0.1:$ETCD_CLIENT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster="e2e=http://127.0.0.1:$ETCD_PEER" --log-level=warn >"$W/logs/etcd.log" 2>&1 &
KUBE_PIDS+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ETCD_CLIENT/health" >/dev/null && break; sleep 0.2; done

"$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_CLIENT" \
  --bind-address=127.0.0.1 --secure-port="$API_PORT" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=RBAC --allow-privileged=true \
  --enable-priority-and-fairness=false --v=1 >"$W/logs/kube-apiserver.log" 2>&1 &
KUBE_PIDS+=($!)
for _ in $(seq 1 300); do curl -sfk "https://127.0.0.1:$API_PORT/readyz" >/dev/null && break; sleep 0.2; done
curl -sfk "https://127.0.0.1:$API_PORT/readyz" >/dev/null || { echo "kube-apiserver did not become ready" >&2; tail -20 "$W/logs/kube-apiserver.log" >&2; return 1 2>/dev/null || exit 1; }

"$BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG" --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port=0 --controllers='*' \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --v=1 \
  >"$W/logs/kube-controller-manager.log" 2>&1 &
KUBE_PIDS+=($!)
"$BIN/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port=0 --v=1 >"$W/logs/kube-scheduler.log" 2>&1 &
KUBE_PIDS+=($!)

# kwok's stages, from its own module: nodes become Ready, scheduled pods Running and Ready,
# deleted pods go. One change: a pod of the image NEVER_READY_IMAGE never becomes ready (an
# image that crash-loops, for the tests of a halted upgrade).
export NEVER_READY_IMAGE="ursula/ursula-node:9.9.9-never-ready"
STAGES="$(cd / && go mod download -json sigs.k8s.io/kwok@v0.8.0 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/kustomize/stage"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  echo '---'
  if [ "$f" = pod/fast/pod-ready.yaml ]; then
    awk -v image="$NEVER_READY_IMAGE" '{ print }
      /^    matchExpressions:$/ && !done {
        print "    - key: \x27.spec.containers.[0].image\x27"
        print "      operator: \x27NotIn\x27"
        print "      values:"
        print "      - \x27" image "\x27"
        done = 1
      }' "$STAGES/$f"
  else
    cat "$STAGES/$f"
  fi
done >"$W/kwok.yaml"
grep -q "$NEVER_READY_IMAGE" "$W/kwok.yaml" || { echo "up.sh: kwok's pod-ready stage changed shape" >&2; return 1 2>/dev/null || exit 1; }
"$BIN/kwok" --kubeconfig="$KUBECONFIG" --config="$W/kwok.yaml" --manage-all-nodes=true \
  --node-lease-duration-seconds=40 --cidr=10.0.0.0/16 --node-ip=10.0.0.1 >"$W/logs/kwok.log" 2>&1 &
KUBE_PIDS+=($!)
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: kwok-node-0, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
EOF
kubectl wait --for=condition=Ready node/kwok-node-0 --timeout=60s >/dev/null
for _ in $(seq 1 100); do kubectl get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done
echo "control plane up: KUBECONFIG=$KUBECONFIG"
