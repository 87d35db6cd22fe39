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
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import helm_python as helm

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("URSULA_BIN_DIR", ROOT / "target" / "debug")).resolve()
NEVER_READY = os.environ.get("NEVER_READY_IMAGE", "ursula/ursula-node:9.9.9-never-ready")
NS = "prod"
OPERATOR_NS = "ursula-system"
RELEASE = "streams"
VOTERS = 3
GATEWAYS = 2
READY_TIMEOUT_S = 15
S3_SERVER = ROOT / "e2e" / ".tools" / "s3" / "bin" / "moto_server"
S3_BUCKET = "ursula-lifecycle"


def kubectl(*args, input=None, check=True):
    done = subprocess.run(
        ["kubectl", *args], input=input, capture_output=True, text=True, timeout=60
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def get_json(*args):
    return json.loads(kubectl("get", *args, "-o", "json"))


def wait_for(what, predicate, timeout=120.0, every=0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except OSError as error:  # a process not listening yet
            last = error
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def voter_ip(ordinal):
    return f"127.0.0.1{ordinal}"


def request(method, ordinal, path, body=None, headers=None, port=4437, follow=True):
    """One HTTP request to voter `ordinal`, following leader redirects as clients do."""
    host, target = voter_ip(ordinal), path
    for _ in range(5):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        location = response.getheader("Location")
        if follow and response.status == 307 and location:
            rest = location.split("://", 1)[1]
            hostport, _, target = rest.partition("/")
            host, _, port = hostport.partition(":")
            target = "/" + target
            continue
        return response.status, data
    raise AssertionError(f"{method} {path}: too many redirects")


def free_port():
    """A loopback port free now, below the ephemeral range (no outgoing connection takes it)."""
    for port in range(20000 + os.getpid() % 10000, 32000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port")


def s3_request(port, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def secret_env(container):
    """The container's environment variables that come from Secret keys, resolved."""
    env = {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = get_json("secret", "-n", NS, ref["name"])
            env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


class Producer(threading.Thread):
    """Appends `p:<seq>` lines to a stream for as long as it runs, as an idempotent producer
    does: an append whose fate is unknown (no answer, a 503, a voter gone) is retried with the
    same sequence number on the next voter until it is answered; `seq` only moves on a 200 or
    204. Counts what it could not write at once, so the test can say what an upgrade cost."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.acked = 0
        self.retries = 0
        self.unexpected = []
        self.stopping = threading.Event()

    def run(self):
        voter = 0
        deadline = None
        while True:
            if self.stopping.is_set():
                # Finish the append in flight (its fate may be unknown), then stop.
                deadline = deadline or time.monotonic() + 60
                if time.monotonic() > deadline:
                    self.unexpected.append("could not finish the last append")
                    return
            headers = {
                "Content-Type": "text/plain",
                "Producer-Id": "p",
                "Producer-Epoch": "0",
                "Producer-Seq": str(self.acked),
            }
            try:
                status, body = request(
                    "POST", voter, self.path, body=f"p:{self.acked}\n".encode(), headers=headers
                )
            except (OSError, http.client.HTTPException, AssertionError):
                status, body = None, b""
            if status in (200, 204):
                self.acked += 1
                if self.stopping.is_set():
                    return
                continue
            if status not in (None, 503):
                self.unexpected.append((status, body[:200]))
            self.retries += 1
            voter = (voter + 1) % VOTERS
            time.sleep(0.05)

    def stop(self):
        self.stopping.set()
        self.join(timeout=90)


class VoterProcesses(threading.Thread):
    """The test kubelet of the voter pods (see the module docs)."""

    def __init__(self, workdir):
        super().__init__(daemon=True)
        self.workdir = pathlib.Path(workdir)
        self.running = {}  # ordinal -> (pod uid, Popen)
        self.log = []  # (time, ordinal, what)
        self.stopping = threading.Event()
        self.error = None
        self.passes = 0
        self.quiet = False

    def config_for(self, ordinal):
        config_map = get_json("configmap", "-n", NS, f"{RELEASE}-config")
        text = config_map["data"][f"{RELEASE}-{ordinal}.toml"]
        for i in range(VOTERS):
            text = text.replace(f"{RELEASE}-{i}.{RELEASE}-headless.{NS}.svc", voter_ip(i))
        text = text.replace("0.0.0.0", voter_ip(ordinal))
        text = text.replace('"/var/lib/ursula"', json.dumps(str(self.workdir / f"voter-{ordinal}")))
        path = self.workdir / f"voter-{ordinal}.toml"
        path.write_text(text)
        return path

    def stop_process(self, ordinal):
        entry = self.running.pop(ordinal, None)
        if entry is None or entry[1] is None:
            return
        process = entry[1]
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.log.append((time.monotonic(), ordinal, "stopped"))

    def sync(self):
        pods = get_json("pods", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=ursula-node")
        live = {}
        for pod in pods["items"]:
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp"):
                continue
            ordinal = int(name.rsplit("-", 1)[1])
            live[ordinal] = (pod["metadata"]["uid"], pod["spec"]["containers"][0])
        for ordinal in list(self.running):
            if ordinal not in live or live[ordinal][0] != self.running[ordinal][0]:
                self.stop_process(ordinal)
        for ordinal, (uid, container) in live.items():
            if ordinal in self.running:
                continue
            image = container["image"]
            if image == NEVER_READY:
                # The image crash-loops: nothing runs, and kwok never makes the pod ready.
                self.running[ordinal] = (uid, None)
                self.log.append((time.monotonic(), ordinal, f"cannot run {image}"))
                continue
            config = self.config_for(ordinal)
            with open(self.workdir / f"voter-{ordinal}.log", "ab") as logfile:
                process = subprocess.Popen(
                    [str(BIN_DIR / "ursula-node"), "--config", str(config)],
                    # The pod's environment, not the host's credentials.
                    env={
                        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                        **secret_env(container),
                    },
                    stdout=logfile,
                    stderr=logfile,
                )
            self.running[ordinal] = (uid, process)
            self.log.append((time.monotonic(), ordinal, f"started {image}"))

    def run(self):
        while not self.stopping.is_set():
            before = list(self.log)
            try:
                self.sync()
                self.quiet = self.log == before
            except Exception as error:  # the control plane is slow for a moment: retry
                self.error = error
                self.quiet = False
            self.passes += 1
            time.sleep(0.3)

    def wait_synced(self):
        """Until a whole pass over the pods, started after this call, changed nothing: every
        voter pod has its process, and no process outlives its pod."""
        start = self.passes
        wait_for(
            "the test kubelet to catch up",
            lambda: self.passes >= start + 2 and self.quiet,
            timeout=60,
            every=0.1,
        )

    def shutdown(self):
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=10)
        for ordinal in list(self.running):
            entry = self.running.pop(ordinal)
            if entry[1] is not None:
                entry[1].kill()
                entry[1].wait()


class Watch(threading.Thread):
    """A `kubectl get --watch` printing one line per change, kept in order as parsed by
    `parse` (lines it answers None for are dropped)."""

    def __init__(self, args, parse):
        super().__init__(daemon=True)
        self.process = subprocess.Popen(
            ["kubectl", "get", *args, "--watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.parse = parse
        self.events = []
        self.lock = threading.Lock()

    def run(self):
        for line in self.process.stdout:
            event = self.parse(line.rstrip("\n"))
            if event is not None:
                with self.lock:
                    self.events.append(event)

    def mark(self):
        with self.lock:
            return len(self.events)

    def since(self, mark):
        with self.lock:
            return list(self.events[mark:])

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


POD_EVENT_FORMAT = (
    '{.type}{" "}{.object.metadata.name}{" "}{.object.metadata.uid}{" "}'
    '{.object.metadata.labels.app\\.kubernetes\\.io/name}{" "}'
    '{.object.spec.containers[0].image}{" "}'
    '{.object.status.conditions[?(@.type=="Ready")].status}{" "}'
    '{.object.metadata.deletionTimestamp}{"\\n"}'
)


def pod_event(raw):
    parts = raw.split()
    if len(parts) < 5:
        return None
    kind, name, uid, component, image = parts[:5]
    rest = parts[5:]
    return {
        "type": kind,
        "name": name,
        "uid": uid,
        "component": component,
        "version": image.rsplit(":", 1)[-1],
        "ready": "True" in rest,
        "deleting": kind == "DELETED" or any(p[:2] == "20" for p in rest),
        "raw": raw,
    }


def pod_events():
    """Every change of the namespace's pods."""
    args = ["pods", "-n", NS, "--output-watch-events", "-o", f"jsonpath={POD_EVENT_FORMAT}"]
    return Watch(args, pod_event)


def status_steps():
    """`status.upgradeStep` of the cluster at every write of it."""
    fmt = '{.status.upgradeStep}{"\\n"}'
    return Watch(["ursulacluster", RELEASE, "-n", NS, "-o", f"jsonpath={fmt}"], str.strip)


def distinct_steps(values):
    """The steps in the order they began, repeats of one step in a row folded."""
    out = []
    for value in values:
        if value and (not out or out[-1] != value):
            out.append(value)
    return out


def first_deletions(events):
    """(index, event) of the first deletion sign of each pod UID, in order."""
    seen, out = set(), []
    for i, event in enumerate(events):
        if event["deleting"] and event["uid"] not in seen:
            seen.add(event["uid"])
            out.append((i, event))
    return out


class step:
    """A named step of the scenario; a failure names the step it happened in."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        print(f"step: {self.name}", file=sys.stderr, flush=True)
        self.started = time.monotonic()

    def __exit__(self, kind, error, trace):
        if error is not None:
            raise AssertionError(f"step {self.name!r}: {error}") from error
        print(f"  ok ({time.monotonic() - self.started:.1f}s)", file=sys.stderr, flush=True)
        return False


def cluster_status():
    return get_json("ursulacluster", "-n", NS, RELEASE).get("status", {})


def condition(status, kind):
    for c in status.get("conditions", []):
        if c["type"] == kind:
            return c
    return {}


def settled_at(version):
    def check():
        status = cluster_status()
        ok = (
            condition(status, "Available").get("reason") == "Ready"
            and status.get("nodeVersion") == version
            and status.get("gatewayVersion") == version
            and status.get("readyVoters") == VOTERS
        )
        return status if ok else None

    return check


def operator_events(reason):
    events = get_json("events", "-n", NS)
    found = []
    for event in sorted(events["items"], key=lambda e: e["metadata"]["creationTimestamp"]):
        if event.get("reason") == reason and event["involvedObject"]["name"] == RELEASE:
            found.append(event.get("note") or event.get("message") or "")
    return found


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
                    "--ready-timeout",
                    str(READY_TIMEOUT_S),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def cluster_chart(self, action, version):
        values = {
            "version": version,
            "voters": VOTERS,
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
        return "\n".join(
            [f"status: {json.dumps(cluster_status())}", "operator log:", *tail]
            + [f"voters: {self.voters.log[-12:]}", f"kubelet error: {self.voters.error!r}"]
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
        # Claims of the voters need volumes (there is no provisioner).
        for i in range(VOTERS):
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
        type(self).passed = True


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
