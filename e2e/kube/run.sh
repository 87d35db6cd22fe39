#!/usr/bin/env bash
# End-to-end tests against a real control plane (up.sh): the apiserver accepts the CRDs and
# itself rejects invalid resources; the operator, a real process, turns an UrsulaCluster into its
# objects and reports it Available once kwok makes the pods ready. Then test_lifecycle.py: both
# charts installed with Helm, upgrades, rollbacks, a halted upgrade and a bucket purge against
# real voter processes.
#
# Usage: e2e/kube/run.sh [path/to/target/dir]   (default target/debug)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin_dir="$(realpath "${1:-$root/target/debug}")"
W="$(mktemp -d)"
operator_pid=""
cleanup() {
  [ -n "$operator_pid" ] && kill -9 "$operator_pid" 2>/dev/null || true
  kube_down || true
  rm -rf "$W"
}
trap cleanup EXIT
# shellcheck source=up.sh
source "$here/up.sh" "$W/kube"

failed=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; failed=1; }

kubectl apply -f "$root/crds/ursulacluster.yaml" -f "$root/crds/bucketpurge.yaml" >/dev/null
kubectl wait --for=condition=Established --timeout=60s \
  crd/ursulaclusters.ursula.io crd/bucketpurges.ursula.io >/dev/null
ok "the apiserver accepts and establishes the CRDs"

kubectl create namespace e2e >/dev/null
kubectl create namespace purges >/dev/null
if out="$(kubectl apply -n e2e -f - 2>&1 <<'EOF'
apiVersion: ursula.io/v1alpha1
kind: UrsulaCluster
metadata: {name: four}
spec: {version: "0.1.0", voters: 4, storage: {size: 1Gi}}
EOF
)"; then fail "an UrsulaCluster with 4 voters was accepted"; else
  grep -q "voters" <<<"$out" && ok "the apiserver rejects 4 voters: $(grep -o 'spec.voters[^,]*' <<<"$out" | head -1)" \
    || fail "4 voters rejected for another reason: $out"
fi

kubectl apply -n purges -f - >/dev/null <<'EOF'
apiVersion: ursula.io/v1alpha1
kind: BucketPurge
metadata: {name: p1}
spec: {cluster: nowhere, bucket: old-data}
EOF
if out="$(kubectl patch -n purges bucketpurge/p1 --type merge -p '{"spec":{"bucket":"other-data"}}' 2>&1)"; then
  fail "an edit of a BucketPurge spec was accepted"
else
  grep -qi "immutable" <<<"$out" && ok "the apiserver rejects edits of a BucketPurge spec (CEL)" \
    || fail "the edit was rejected for another reason: $out"
fi

# Volumes for the voters' claims (no provisioner here).
for i in 0 1 2; do
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: e2e-pv-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: $W/pv-$i}
EOF
done

RUST_LOG=info "$bin_dir/ursula-operator" >"$W/operator.log" 2>&1 &
operator_pid=$!
kubectl apply -n e2e -f - >/dev/null <<'EOF'
apiVersion: ursula.io/v1alpha1
kind: UrsulaCluster
metadata: {name: streams}
spec: {version: "0.1.0", voters: 3, gatewayReplicas: 2, storage: {size: 1Gi}}
EOF
for _ in $(seq 1 60); do
  kubectl get -n e2e statefulset/streams deployment/streams-gateway >/dev/null 2>&1 && break
  sleep 1
done
if kubectl get -n e2e statefulset/streams deployment/streams-gateway configmap/streams-config \
  service/streams service/streams-headless serviceaccount/streams-ursula >/dev/null 2>&1; then
  ok "the operator created the StatefulSet, gateway Deployment, ConfigMap, Services, ServiceAccount"
else
  fail "the operator did not create the cluster's objects"
fi
[ "$(kubectl get -n e2e pdb -o name | wc -l)" = 2 ] && ok "two PodDisruptionBudgets" || fail "PDBs: $(kubectl get -n e2e pdb -o name)"
owner="$(kubectl get -n e2e statefulset/streams -o jsonpath='{.metadata.ownerReferences[0].kind}')"
[ "$owner" = UrsulaCluster ] && ok "objects are owned by the UrsulaCluster" || fail "owner: $owner"
manager="$(kubectl get -n e2e statefulset/streams -o jsonpath='{.metadata.managedFields[*].manager}')"
grep -q ursula-operator <<<"$manager" && ok "applied server-side by field manager ursula-operator" || fail "managers: $manager"

if kubectl wait -n e2e --for=condition=Available --timeout=180s ursulacluster/streams >/dev/null 2>&1; then
  ok "the UrsulaCluster is Available once its pods are ready ($(kubectl get -n e2e ursulacluster/streams -o jsonpath='{.status.readyVoters}') voters, $(kubectl get -n e2e ursulacluster/streams -o jsonpath='{.status.readyGateways}') gateways)"
else
  fail "the UrsulaCluster did not become Available: $(kubectl get -n e2e ursulacluster/streams -o jsonpath='{.status}')"
  kubectl get -n e2e pods,pvc >&2 || true
  tail -20 "$W/operator.log" >&2
fi
kubectl get -n e2e ursulacluster
phase="$(kubectl get -n purges bucketpurge/p1 -o jsonpath='{.status.phase}')"
[ "$phase" = Pending ] && ok "a BucketPurge for a missing cluster stays Pending" || fail "purge phase: $phase"

venv="$root/e2e/.tools/chart-venv"
"$root/e2e/charts/setup-venv.sh" "$venv" >/dev/null
if URSULA_BIN_DIR="$bin_dir" CERT_MANAGER_CRDS="$BIN/cert-manager-crds.yaml" \
  "$venv/bin/python" "$here/test_cert_manager.py"; then
  ok "spec.tls.issuerRef: cert-manager Certificates, accepted by cert-manager's CRDs; voters run on their Secrets (test_cert_manager.py)"
else
  fail "test_cert_manager.py"
  tail -20 "$W/operator.log" >&2
fi

# The rest runs with the operator of the operator chart (test_lifecycle.py starts it).
kill -9 "$operator_pid" 2>/dev/null || true
wait "$operator_pid" 2>/dev/null || true
operator_pid=""
"$root/e2e/s3/setup.sh" >/dev/null  # the S3-API server of the cluster's objectStore
if URSULA_BIN_DIR="$bin_dir" "$venv/bin/python" "$here/test_lifecycle.py"; then
  ok "install, upgrade, rollback, halted upgrade, bucket purge, 3 -> 5 -> 3 voters (test_lifecycle.py)"
else
  fail "test_lifecycle.py"
fi

exit $failed
