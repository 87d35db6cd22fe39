"""The life of an Ursula cluster on a real control plane (up.sh), installed with Helm.

- The operator chart is installed with a real Helm library, and the `ursula-operator` process
  runs with its ServiceAccount's token: the chart's least-privilege RBAC is what it gets.
- The cluster chart is installed, upgraded, rolled back; a bad version halts with `Degraded`
  and a rollback recovers it; a `BucketPurge` purges and fences a bucket.
- kwok makes pods Running and Ready; `VoterProcesses` (a test kubelet for voter pods) runs a
  real `ursula-node` for each voter pod, with the operator's own config file (addresses
  rewritten to loopback: voter N on 127.0.0.1N, the contract's ports) and the pod's
  environment (the object store's credentials from their Secret), restarts it when its pod is
  replaced, and stops it when its pod goes. Drains and purges go to those processes.
- The cluster has an `objectStore`: a real S3-API server (moto, from e2e/s3/setup.sh), with
  small cold objects, so the voters flush records to it and read them back through every
  restart.

Usage (run.sh does this): KUBECONFIG=... URSULA_BIN_DIR=target/debug python test_lifecycle.py
"""

import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import helm_python as helm

from harness import (
    BIN_DIR,
    GATEWAYS,
    MAX_VOTERS,
    NEVER_READY,
    NS,
    OPERATOR_NS,
    Producer,
    READY_TIMEOUT_S,
    RELEASE,
    S3_BUCKET,
    S3_SERVER,
    ROOT,
    VOTERS,
    VoterProcesses,
    cluster_status,
    condition,
    distinct_steps,
    first_deletions,
    membership_steps,
    free_port,
    get_json,
    voter_ip,
    kubectl,
    operator_events,
    pod_events,
    request,
    s3_request,
    settled_at,
    status_steps,
    step,
    wait_for,
)


class ClusterLifecycle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="ursula-lifecycle-")
        kubeconfig = os.environ["KUBECONFIG"]
        cls.helm_operator = helm.Config(kubeconfig_path=kubeconfig, namespace=OPERATOR_NS)
        cls.helm = helm.Config(kubeconfig_path=kubeconfig, namespace=NS)
        cls.operator = None
        cls.voters = VoterProcesses(cls.work)
        cls.pods = None
        cls.steps = None
        cls.passed = False
        cls.s3_port = free_port()
        cls.s3 = subprocess.Popen(
            [str(S3_SERVER), "-H", "127.0.0.1", "-p", str(cls.s3_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(
                "the S3-API server",
                lambda: s3_request(cls.s3_port, "PUT", f"/{S3_BUCKET}")[0] == 200,
                timeout=30,
            )
        except BaseException:
            cls.s3.kill()
            raise

    @classmethod
    def tearDownClass(cls):
        for watch in (cls.pods, cls.steps):
            if watch:
                watch.stop()
        cls.voters.shutdown()
        cls.s3.kill()
        cls.s3.wait()
        if cls.operator:
            cls.operator.kill()
            cls.operator.wait()
        # The voters' data is ~400 MB a run: kept only when it can explain a failure.
        if cls.passed:
            shutil.rmtree(cls.work, ignore_errors=True)
        else:
            print(f"logs and data of the failed run: {cls.work}", file=sys.stderr)

    def install_operator(self):
        release = self.helm_operator.install(
            ROOT / "charts" / "ursula-operator",
            "ursula-operator",
            {},
            namespace=OPERATOR_NS,
            create_namespace=True,
        )
        self.assertEqual(release["status"], "deployed")
        for crd in ("ursulaclusters.ursula.io", "bucketpurges.ursula.io"):
            kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
        # The operator process gets exactly the chart's RBAC: a token of its ServiceAccount.
        token = kubectl("create", "token", "ursula-operator", "-n", OPERATOR_NS).strip()
        config = json.loads(kubectl("config", "view", "--raw", "-o", "json"))
        cluster = config["clusters"][0]["cluster"]
        kubeconfig = pathlib.Path(self.work) / "operator.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "e2e", "cluster": cluster}],
                    "users": [{"name": "operator", "user": {"token": token}}],
                    "contexts": [
                        {"name": "operator", "context": {"cluster": "e2e", "user": "operator"}}
                    ],
                    "current-context": "operator",
                }
            )
        )
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), RUST_LOG="info")
        type(self).operator_log = pathlib.Path(self.work) / "operator.log"
        with open(self.operator_log, "ab") as log:
            type(self).operator = subprocess.Popen(
                [
                    str(BIN_DIR / "ursula-operator"),
                    "--voter-admin-url",
                    "http://127.0.0.1{ordinal}:4438",
                    "--voter-member-host",
                    "127.0.0.1{ordinal}",
                    "--ready-timeout",
                    str(READY_TIMEOUT_S),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def cluster_chart(self, action, version, voters=VOTERS):
        values = {
            "version": version,
            "voters": voters,
            "volumeReclaim": "Delete",
            "gatewayReplicas": GATEWAYS,
            "storage": {"size": "1Gi"},
            "objectStore": {
                "bucket": S3_BUCKET,
                "endpoint": f"http://127.0.0.1:{self.s3_port}",
                "region": "us-east-1",
                "credentialsSecret": "lifecycle-s3",
            },
            # Small cold objects, flushed often: the test's few KiB of records go cold.
            "nodeConfig": {
                "storage.cold.segment_size": 256,
                "storage.cold.flush_interval": "200ms",
            },
        }
        chart = ROOT / "charts" / "ursula"
        if action == "install":
            return self.helm.install(chart, RELEASE, values, namespace=NS, create_namespace=True)
        return self.helm.upgrade(chart, RELEASE, values, namespace=NS)

    def diagnostics(self):
        tail = self.operator_log.read_text(errors="replace").splitlines()[-30:]
        try:
            status = json.dumps(cluster_status())
        except Exception as error:  # a control plane too slow to answer is itself the news
            status = f"unreadable: {error!r}"
        return "\n".join(
            [f"status: {status}", "operator log:", *tail]
            + [self.voters.report()]
        )

    def wait_settled(self, version, timeout=180):
        """The operator reports the cluster settled at `version`, and every running voter
        process answers `/readyz` (kwok marks pods ready at once; a kubelet would probe)."""
        try:
            status = wait_for(f"the cluster settled at {version}", settled_at(version), timeout)
            self.voters.wait_synced()
            for ordinal in range(VOTERS):
                wait_for(
                    f"voter {ordinal} ready",
                    lambda o=ordinal: request("GET", o, "/readyz", port=4438)[0] == 200,
                    timeout=60,
                )
            return status
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.diagnostics()}") from None

    def assert_voters_one_at_a_time(self, events, order):
        """Voter pods were deleted in `order`, each only after the previous one's new pod
        was ready. Returns [(ordinal, index of its first deletion)].

        kwok deletes a terminating pod by name, with no UID precondition: a delete it queued
        for the old pod can hit the new pod of the same name, which goes at once and is
        recreated. Repeats of one ordinal in a row are that, not the operator (it deletes by
        UID; `ReplacingVoter` events, checked too, show one replacement per voter)."""
        with open(pathlib.Path(self.work) / "pod-events.jsonl", "a") as out:
            out.writelines(json.dumps(e) + "\n" for e in events)
        runs = []  # [ordinal, index of the first deletion, UIDs deleted]
        for index, event in first_deletions(events):
            if event["component"] != "ursula-node":
                continue
            ordinal = int(event["name"].rsplit("-", 1)[1])
            if runs and runs[-1][0] == ordinal:
                runs[-1][2].add(event["uid"])
            else:
                runs.append([ordinal, index, {event["uid"]}])
        voter_lines = "\n".join(e["raw"] for e in events if e["component"] == "ursula-node")
        self.assertEqual(
            [run[0] for run in runs],
            order,
            f"voter deletion order; voter pod events:\n{voter_lines}",
        )
        for (ordinal, _, deleted), (_, next_index, _) in zip(runs, runs[1:]):
            replaced_ready = [
                e
                for e in events[:next_index]
                if e["name"] == f"{RELEASE}-{ordinal}" and e["uid"] not in deleted and e["ready"]
            ]
            self.assertTrue(
                replaced_ready,
                f"voter {ordinal} was back and ready before the next deletion:\n{voter_lines}",
            )
        return [(run[0], run[1]) for run in runs]

    def test_lifecycle(self):
        # Claims of the voters need volumes (there is no provisioner); two more for the growth.
        for i in range(MAX_VOTERS):
            kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": f"lifecycle-pv-{i}"},
                        "spec": {
                            "capacity": {"storage": "1Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "hostPath": {"path": f"{self.work}/pv-{i}"},
                            # Bound ahead to voter i's claim: other tests' claims wait too.
                            "claimRef": {"namespace": NS, "name": f"data-{RELEASE}-{i}"},
                        },
                    }
                ),
            )
        kubectl("create", "namespace", NS)
        kubectl(
            "create", "secret", "generic", "lifecycle-s3", "-n", NS,
            "--from-literal=AWS_ACCESS_KEY_ID=lifecycle", "--from-literal=AWS_SECRET_ACCESS_KEY=lifecycle",
        )
        with step("helm install of the operator chart; the operator runs with its RBAC"):
            self.install_operator()
        self.voters.start()
        type(self).pods = pod_events()
        self.pods.start()

        with step("helm install of the cluster chart: Available, real voters serve"):
            release = self.cluster_chart("install", "0.1.0")
            self.assertEqual(release["status"], "deployed")
            self.wait_settled("0.1.0")
            self.assertEqual(request("PUT", 0, "/orders")[0], 201)
            status, _ = request(
                "PUT", 1, "/orders/eu", headers={"Content-Type": "text/plain"}, body=b"a"
            )
            self.assertEqual(status, 201)

        with step("the cluster's credentials and NetworkPolicy: accepted by the API server, mounted, used"):
            tls = get_json("secret", "-n", NS, f"{RELEASE}-cluster-tls")
            self.assertEqual(
                sorted(tls["data"]),
                ["ca.crt"] + [f"node-{i + 1}.{ext}" for i in range(VOTERS) for ext in ("crt", "key")],
            )
            self.assertIn("ursula.io/not-after", tls["metadata"]["annotations"])
            self.assertNotIn("ca.key", tls["data"], "the CA's key is never mounted")
            token = base64.b64decode(
                get_json("secret", "-n", NS, f"{RELEASE}-admin-token")["data"]["token"]
            ).decode()
            self.assertEqual(len(token), 64)
            get_json("secret", "-n", NS, f"{RELEASE}-ca")
            pod_spec = get_json("statefulset", "-n", NS, RELEASE)["spec"]["template"]["spec"]
            mounted = {v["name"]: v.get("secret", {}).get("secretName") for v in pod_spec["volumes"]}
            self.assertEqual(mounted["cluster-tls"], f"{RELEASE}-cluster-tls")
            self.assertEqual(mounted["admin-token"], f"{RELEASE}-admin-token")
            self.assertEqual(mounted["signing-key"], f"{RELEASE}-signing-key")
            signing = get_json("secret", "-n", NS, f"{RELEASE}-signing-key")["data"]
            self.assertIn("BEGIN PRIVATE KEY", base64.b64decode(signing["signing-key.pem"]).decode())
            # Every voter signs subscription webhooks with the one key the Secret holds.
            kids = set()
            for ordinal in range(VOTERS):
                status, jwks = request("GET", ordinal, "/v1/stream/__ds/jwks.json")
                self.assertEqual(status, 200)
                kids |= {key["kid"] for key in json.loads(jwks)["keys"]}
            self.assertEqual(len(kids), 1, kids)
            policy = get_json("networkpolicy", "-n", NS, f"{RELEASE}-voters")
            ports = sorted(r["ports"][0]["port"] for r in policy["spec"]["ingress"])
            # The operator runs outside the cluster here: it knows no namespace of its own,
            # so the admin port has no rule, and nothing reaches it but the kubelet.
            self.assertEqual(ports, [4437, 4439])
            # The voters speak TLS to each other: a plain peer link gets at most a TLS alert
            # (record type 0x15), and the connection ends.
            with socket.create_connection((voter_ip(0), 4439), timeout=5) as plain:
                plain.sendall(b"URSLINK1" + bytes(12))
                plain.settimeout(10)
                answer = b""
                try:
                    while chunk := plain.recv(64):
                        answer += chunk
                except ConnectionResetError:
                    pass
                self.assertTrue(answer == b"" or answer.startswith(b"\x15"), answer)
            # Drains and purges ask for the token.
            status, _ = request("POST", 0, "/admin/drain", port=4438, follow=False)
            self.assertEqual(status, 401)
            status, _ = request(
                "POST", 0, "/admin/drain", port=4438, follow=False,
                headers={"Authorization": f"Bearer {token}x"},
            )
            self.assertEqual(status, 401)

        type(self).steps = status_steps()
        self.steps.start()
        time.sleep(1)  # the watch is established
        moves = {"gateways", "voter 2", "voter 1", "voter 0"}
        producer = Producer("/orders/rolling")
        with step("helm upgrade: gateways first, then voters 2, 1, 0"):
            status, _ = request(
                "PUT", 0, "/orders/rolling", headers={"Content-Type": "text/plain"}
            )
            self.assertEqual(status, 201)
            producer.start()
            mark, step_mark = self.pods.mark(), self.steps.mark()
            self.cluster_chart("upgrade", "0.2.0")
            self.wait_settled("0.2.0")
            events = self.pods.since(mark)
            shown = [v for v in distinct_steps(self.steps.since(step_mark)) if v in moves]
            self.assertEqual(shown, ["gateways", "voter 2", "voter 1", "voter 0"], "status.upgradeStep")
            deletions = self.assert_voters_one_at_a_time(events, [2, 1, 0])
            first_voter = deletions[0][1]
            old_gateways = {
                e["uid"] for e in events if e["component"] == "ursula-gateway" and e["version"] == "0.1.0"
            }
            gateway_deletions = {
                e["uid"]: i
                for i, e in first_deletions(events)
                if e["component"] == "ursula-gateway"
            }
            self.assertEqual(set(gateway_deletions), old_gateways, "every old gateway pod went")
            self.assertLess(
                max(gateway_deletions.values()), first_voter, "gateways replaced before any voter"
            )
            self.assertEqual(
                operator_events("ReplacingVoter")[-3:],
                [f"draining and replacing voter {o} for version 0.2.0" for o in (2, 1, 0)],
            )
            self.assertTrue(operator_events("RollingGateways"), "a RollingGateways event")
            # The cluster kept its data and takes writes after every voter was restarted.
            status, body = request("GET", 2, "/orders/eu?offset=-1")
            self.assertEqual((status, body), (200, b"a"))
            status, _ = request("POST", 0, "/orders/eu", body=b"b", headers={"Content-Type": "text/plain"})
            self.assertEqual(status, 204)

        with step("helm rollback: voters 2, 1, 0 first, gateways last"):
            mark, step_mark = self.pods.mark(), self.steps.mark()
            self.helm.rollback(RELEASE, version=1)
            self.wait_settled("0.1.0")
            events = self.pods.since(mark)
            shown = [v for v in distinct_steps(self.steps.since(step_mark)) if v in moves]
            self.assertEqual(shown, ["voter 2", "voter 1", "voter 0", "gateways"], "status.upgradeStep")
            deletions = self.assert_voters_one_at_a_time(events, [2, 1, 0])
            gateway_deletions = [
                i
                for i, e in first_deletions(events)
                if e["component"] == "ursula-gateway" and e["version"] == "0.2.0"
            ]
            self.assertEqual(len(gateway_deletions), GATEWAYS, "both new gateways went")
            self.assertGreater(
                min(gateway_deletions), deletions[-1][1], "gateways only after every voter"
            )

        with step("a producer writing through the upgrade and the rollback lost nothing"):
            producer.stop()
            self.assertFalse(producer.is_alive(), "the producer finished")
            self.assertEqual(producer.unexpected, [], "only 503s or no answer while voters moved")
            status, body = request("GET", 0, "/orders/rolling?offset=-1")
            self.assertEqual(status, 200)
            lines = body.decode().splitlines()
            self.assertEqual(
                lines,
                [f"p:{i}" for i in range(producer.acked)],
                "every acknowledged append once, in order, and nothing else",
            )
            self.assertGreater(producer.acked, 50, "the producer kept writing")
            # The voters got the object store from the operator and its credentials from the
            # Secret: the stream's older records are objects under the cluster's prefix.
            wait_for(
                "cold objects in the bucket",
                lambda: f"<Key>{NS}/{RELEASE}/g".encode()
                in s3_request(self.s3_port, "GET", f"/{S3_BUCKET}?list-type=2&prefix={NS}/{RELEASE}/")[1],
                timeout=30,
            )
            print(
                f"  {producer.acked} appends acknowledged across 6 voter restarts, "
                f"{producer.retries} retried",
                file=sys.stderr,
            )

        with step("a voter that never becomes ready halts the upgrade with Degraded"):
            version = NEVER_READY.rsplit(":", 1)[1]
            self.cluster_chart("upgrade", version)

            def halted():
                status = cluster_status()
                degraded = condition(status, "Degraded")
                return status if degraded.get("status") == "True" else None

            status = wait_for("Degraded", halted, timeout=READY_TIMEOUT_S + 90)
            self.assertEqual(condition(status, "Degraded")["reason"], "UpgradeHalted")
            self.assertIn("voter 2", condition(status, "Degraded")["message"])
            self.assertEqual(status["gatewayVersion"], version)
            pods = get_json("pods", "-n", NS, "-l", "app.kubernetes.io/name=ursula-node")
            versions = {
                p["metadata"]["name"]: p["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
                for p in pods["items"]
            }
            self.assertEqual(
                versions,
                {f"{RELEASE}-0": "0.1.0", f"{RELEASE}-1": "0.1.0", f"{RELEASE}-2": version},
                "only voter 2 was replaced",
            )
            self.assertTrue(operator_events("UpgradeHalted"), "an UpgradeHalted event")
            time.sleep(3)
            self.assertEqual(condition(cluster_status(), "Degraded").get("status"), "True", "the halt stays")
            # The two remaining voters are a quorum: the cluster still takes writes.
            status, _ = request("POST", 0, "/orders/eu", body=b"c", headers={"Content-Type": "text/plain"})
            self.assertEqual(status, 204)

        with step("helm rollback of the halted upgrade recovers the cluster"):
            history = self.helm.history(RELEASE)
            self.helm.rollback(RELEASE, version=len(history) - 1)
            status = self.wait_settled("0.1.0")
            self.assertNotEqual(condition(status, "Degraded").get("status"), "True")
            status, body = request("GET", 2, "/orders/eu?offset=-1")
            self.assertEqual((status, body), (200, b"abc"))

        with step("helm upgrade of the operator chart"):
            release = self.helm_operator.upgrade(
                ROOT / "charts" / "ursula-operator",
                "ursula-operator",
                {"logLevel": "debug"},
                namespace=OPERATOR_NS,
            )
            self.assertEqual((release["status"], release["revision"]), ("deployed", 2))
            deployment = get_json("deployment", "-n", OPERATOR_NS, "ursula-operator")
            env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            self.assertIn({"name": "RUST_LOG", "value": "debug"}, env)

        with step("BucketPurge purges and fences a bucket on the running voters"):
            self.assertEqual(request("PUT", 1, "/tenant-a")[0], 201)
            for name in ("one", "two", "three"):
                status, _ = request(
                    "PUT", 2, f"/tenant-a/{name}", body=b"x", headers={"Content-Type": "text/plain"}
                )
                self.assertEqual(status, 201)
            kubectl(
                "apply",
                "-n",
                NS,
                "-f",
                "-",
                input=json.dumps(
                    {
                        "apiVersion": "ursula.io/v1alpha1",
                        "kind": "BucketPurge",
                        "metadata": {"name": "drop-tenant-a"},
                        "spec": {"cluster": RELEASE, "bucket": "tenant-a"},
                    }
                ),
            )

            def finished():
                status = get_json("bucketpurge", "-n", NS, "drop-tenant-a").get("status", {})
                return status if status.get("phase") in ("Succeeded", "Failed") else None

            status = wait_for("the purge to finish", finished, timeout=90)
            self.assertEqual(status["phase"], "Succeeded", status)
            self.assertEqual(status["purgedStreams"], 3)
            for ordinal in range(VOTERS):
                status, body = request("GET", ordinal, "/tenant-a/one")
                self.assertEqual(status, 404, body)
            status, body = request(
                "PUT", 0, "/tenant-a/again", body=b"x", headers={"Content-Type": "text/plain"}
            )
            self.assertEqual(status, 404, "a purged bucket is fenced")
            self.assertIn(b"error", body)
            self.assertEqual(request("GET", 0, "/orders/eu?offset=-1")[1], b"abc", "other buckets stay")

        with step("helm upgrade --set voters=5, then 3 again, while a producer writes"):
            self.grow_and_shrink()
        type(self).passed = True

    def wait_membership(self, voters, timeout=300):
        """The groups' leaders report `voters` voters, the change is over, and the
        StatefulSet has as many pods."""

        def settled():
            status = cluster_status()
            pods = get_json("statefulset", "-n", NS, RELEASE)["spec"]["replicas"]
            done = (
                status.get("raftVoters") == voters
                and not status.get("membershipStep")
                and status.get("voterPods") == voters
                and pods == voters
            )
            return status if done else None

        try:
            return wait_for(f"{voters} voters", settled, timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.diagnostics()}") from None

    def grow_and_shrink(self):
        status, _ = request("PUT", 0, "/orders/growing", headers={"Content-Type": "text/plain"})
        self.assertEqual(status, 201)
        producer = Producer("/orders/growing")
        producer.start()
        watch = membership_steps()
        watch.start()
        time.sleep(1)  # the watch is established
        actions = ("scale", "add", "promote", "demote", "remove")
        budget = lambda: get_json("pdb", "-n", NS, f"{RELEASE}-voters")["spec"]["maxUnavailable"]
        try:
            self.assertEqual(budget(), 1)
            mark = watch.mark()
            self.cluster_chart("upgrade", "0.1.0", voters=5)
            self.wait_membership(5)
            grown = [s for s in distinct_steps(watch.since(mark)) if s.startswith(actions)]
            self.assertEqual(
                grown,
                ["scale to 5 pods", "add voter 4 as a learner", "promote voter 4",
                 "add voter 5 as a learner", "promote voter 5"],
                "status.membershipStep while growing",
            )
            self.assertEqual(budget(), 2, "the PodDisruptionBudget widened with the voters")
            for ordinal in (3, 4):
                wait_for(f"voter {ordinal} ready",
                         lambda o=ordinal: request("GET", o, "/readyz", port=4438)[0] == 200,
                         timeout=60)

            mark = watch.mark()
            self.cluster_chart("upgrade", "0.1.0", voters=3)
            self.wait_membership(3)
            shrunk = [s for s in distinct_steps(watch.since(mark)) if s.startswith(actions)]
            self.assertEqual(
                shrunk,
                ["demote voter 5", "remove voter 5", "demote voter 4", "remove voter 4",
                 "scale to 3 pods"],
                "status.membershipStep while shrinking",
            )
            self.assertEqual(budget(), 1)
            notes = operator_events("MembershipStep")
            for expected in grown + shrunk:
                self.assertTrue(any(note.startswith(expected) for note in notes),
                                f"a MembershipStep event {expected!r} in {notes}")
            # volumeReclaim Delete: the removed voters' claims go with them.
            claims = get_json("pvc", "-n", NS)["items"]
            names = sorted(c["metadata"]["name"] for c in claims
                           if not c["metadata"].get("deletionTimestamp"))
            self.assertEqual(names, [f"data-{RELEASE}-{i}" for i in range(VOTERS)])
        finally:
            watch.stop()
            producer.stop()
        self.assertEqual(producer.unexpected, [], "only 503s or no answer while voters moved")
        status, body = request("GET", 0, "/orders/growing?offset=-1")
        self.assertEqual(status, 200)
        self.assertEqual(
            body.decode().splitlines(),
            [f"p:{i}" for i in range(producer.acked)],
            "every acknowledged append once, in order, and nothing else",
        )
        self.assertGreater(producer.acked, 20, "the producer kept writing")
        print(f"  {producer.acked} appends acknowledged through 3 -> 5 -> 3 voters, "
              f"{producer.retries} retried", file=sys.stderr)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
