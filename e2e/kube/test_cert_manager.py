"""An UrsulaCluster whose voters' certificates come from cert-manager (`spec.tls.issuerRef`),
on the real control plane of run.sh, with the operator run.sh started.

- Before cert-manager's API exists the cluster is Degraded (`CertManagerMissing`).
- Once cert-manager's own CRDs are installed (fetched from its Go module by build.sh), the
  operator makes a `Certificate` per voter, which the apiserver checks against cert-manager's
  schema, and the voters' StatefulSet mounts the Secrets they name.
- cert-manager's controller is the one part that is not real here: its main module is not
  served by the Go module proxy. The test STANDS IN for it and writes the Secrets its CA
  issuer would (`tls.crt`, `tls.key`, `ca.crt`), from a CA made by `ursula-node issue-certs`.
- Then three real `ursula-node` processes run with the files as the pods' projected volume
  lays them out (`VoterProcesses`): they form a cluster over mutual TLS and take writes.

Usage (run.sh does this): KUBECONFIG=... URSULA_BIN_DIR=target/debug CERT_MANAGER_CRDS=...
python test_cert_manager.py
"""

import json
import os
import subprocess
import tempfile
import unittest

from harness import (
    BIN_DIR,
    VOTERS,
    VoterProcesses,
    condition,
    get_json,
    kubectl,
    request,
    wait_for,
)

NS = "certs"
NAME = "issued"
CRDS = os.environ["CERT_MANAGER_CRDS"]


def status():
    return get_json("ursulacluster", "-n", NS, NAME).get("status", {})


def reason_of(kind):
    found = condition(status(), kind)
    return found and (found["status"], found["reason"], found["message"])


class CertManager(unittest.TestCase):
    def test_cert_manager_issues_the_voters_certificates(self):
        kubectl("create", "namespace", NS)
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps({
            "apiVersion": "ursula.io/v1alpha1", "kind": "UrsulaCluster",
            "metadata": {"name": NAME},
            "spec": {"version": "0.1.0", "voters": VOTERS, "gatewayReplicas": 1,
                     "storage": {"size": "1Gi"},
                     "tls": {"issuerRef": {"name": "ursula-ca"}}},
        }))

        # Without cert-manager: a clear refusal, nothing half made.
        degraded = wait_for(
            "Degraded CertManagerMissing",
            lambda: (reason_of("Degraded") or (None, None))[1] == "CertManagerMissing"
            and reason_of("Degraded"),
            timeout=60,
        )
        self.assertIn("certificates.cert-manager.io", degraded[2])

        kubectl("apply", "-f", CRDS)
        kubectl("wait", "--for=condition=Established", "--timeout=60s",
                "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
        kubectl("apply", "-n", NS, "-f", "-", input=json.dumps({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "ursula-ca"},
            "spec": {"ca": {"secretName": "ursula-ca-keypair"}},
        }))

        # A Certificate per voter, as cert-manager's own schema accepts it.
        certificates = wait_for(
            "the voters' Certificates",
            lambda: len(items := get_json("certificates.cert-manager.io", "-n", NS)["items"])
            == VOTERS and items,
            timeout=90,  # the operator looks again 30 s after it found no cert-manager
        )
        by_name = {c["metadata"]["name"]: c["spec"] for c in certificates}
        self.assertEqual(sorted(by_name), [f"{NAME}-node-{i}" for i in range(1, VOTERS + 1)])
        for i in range(1, VOTERS + 1):
            spec = by_name[f"{NAME}-node-{i}"]
            self.assertEqual(spec["secretName"], f"{NAME}-node-{i}-tls")
            self.assertEqual(
                spec["dnsNames"],
                [f"node-{i}.ursula.internal", f"{NAME}-{i - 1}.{NAME}-headless.{NS}.svc"],
            )
            self.assertEqual(
                spec["issuerRef"],
                {"name": "ursula-ca", "kind": "Issuer", "group": "cert-manager.io"},
            )
            self.assertIn("client auth", spec["usages"])
        waiting = wait_for(
            "CertificatesReady False",
            lambda: (reason_of("CertificatesReady") or ("",))[0] == "False"
            and reason_of("CertificatesReady"),
            timeout=60,
        )
        self.assertEqual(waiting[1], "WaitingForCertManager")
        self.assertIn(f"{NAME}-node-1-tls", waiting[2])
        for own in (f"{NAME}-ca", f"{NAME}-cluster-tls"):
            self.assertEqual(
                kubectl("get", "secret", "-n", NS, own, check=False), "", f"{own} is not made"
            )
        pod = get_json("statefulset", "-n", NS, NAME)["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "cluster-tls")
        self.assertEqual(
            [s["secret"]["name"] for s in volume["projected"]["sources"]],
            [f"{NAME}-node-{i}-tls" for i in range(1, VOTERS + 1)],
        )

        # The issuer cannot change under running voters.
        refused = subprocess.run(
            ["kubectl", "patch", "-n", NS, f"ursulacluster/{NAME}", "--type", "merge",
             "-p", '{"spec":{"tls":{"issuerRef":{"name":"another-ca"}}}}'],
            capture_output=True, text=True,
        )
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("spec.tls is fixed at creation", refused.stderr)

        with tempfile.TemporaryDirectory() as work:
            # STAND-IN for cert-manager's controller: the Secrets its CA issuer writes.
            issued = os.path.join(work, "issued")
            subprocess.run(
                [str(BIN_DIR / "ursula-node"), "issue-certs", "--dir", issued,
                 "--nodes", ",".join(str(i) for i in range(1, VOTERS + 1))],
                check=True, capture_output=True,
            )
            for i in range(1, VOTERS + 1):
                kubectl(
                    "create", "secret", "generic", "-n", NS, f"{NAME}-node-{i}-tls",
                    "--type", "kubernetes.io/tls",
                    f"--from-file=tls.crt={issued}/node-{i}.pem",
                    f"--from-file=tls.key={issued}/node-{i}.key",
                    f"--from-file=ca.crt={issued}/ca.pem",
                )
            ready = wait_for(
                "CertificatesReady True",
                lambda: (reason_of("CertificatesReady") or ("",))[0] == "True"
                and reason_of("CertificatesReady"),
                timeout=60,
            )
            self.assertIn("Issuer ursula-ca", ready[2])

            # Real voters, each with the files its pod's projected volume holds.
            voters = VoterProcesses(work, ns=NS, release=NAME)
            voters.start()
            try:
                voters.wait_synced(VOTERS)
                wait_for(
                    "the voters to elect a leader over mutual TLS",
                    lambda: request("PUT", 0, "/certified")[0] in (200, 201),
                    timeout=90,
                    every=1,
                )
                status_code, _ = request(
                    "PUT", 1, "/certified/log", headers={"Content-Type": "text/plain"},
                    body=b"through cert-manager's certificates\n",
                )
                self.assertEqual(status_code, 201)
                status_code, body = request("GET", 2, "/certified/log?offset=-1")
                self.assertEqual((status_code, body), (200, b"through cert-manager's certificates\n"))
            except AssertionError as error:
                raise AssertionError(f"{error}\n{voters.report()}") from None
            finally:
                voters.shutdown()
        kubectl("delete", "namespace", NS, "--wait=false")


if __name__ == "__main__":
    unittest.main(verbosity=2)
