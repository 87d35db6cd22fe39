"""The harness of test_lifecycle.py: kubectl and HTTP helpers, the test kubelet of voter pods
(`VoterProcesses`), an idempotent `Producer`, watches of pods and of the cluster's status,
and the S3-API server helpers of the cluster's objectStore."""

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
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("URSULA_BIN_DIR", ROOT / "target" / "debug")).resolve()
NEVER_READY = os.environ.get("NEVER_READY_IMAGE", "ursula/ursula-node:9.9.9-never-ready")
NS = "prod"
OPERATOR_NS = "ursula-system"
RELEASE = "streams"
VOTERS = 3
# A cluster grows to this many voters (voter N on 127.0.0.1N).
MAX_VOTERS = 5
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


def secret_env(container, ns=NS):
    """The container's environment variables that come from Secret keys, resolved."""
    env = {}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = get_json("secret", "-n", ns, ref["name"])
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

    def __init__(self, workdir, ns=NS, release=RELEASE):
        super().__init__(daemon=True)
        self.workdir = pathlib.Path(workdir)
        self.ns = ns
        self.release = release
        self.running = {}  # ordinal -> (pod uid, Popen)
        self.log = []  # (time, ordinal, what)
        self.stopping = threading.Event()
        self.error = None
        self.passes = 0
        self.quiet = False
        self.secrets_this_pass = {}

    def volume_files(self, volume):
        """The files of a Secret volume, or of a projected volume of Secrets (each item's key
        at its path, or every key when it names no items), as a kubelet lays them out; None
        for other volumes."""
        if "secret" in volume:
            sources = [{"name": volume["secret"]["secretName"]}]
        elif "projected" in volume:
            sources = [s["secret"] for s in volume["projected"]["sources"] if "secret" in s]
        else:
            return None
        files = {}
        for source in sources:
            name = source["name"]
            if name not in self.secrets_this_pass:
                self.secrets_this_pass[name] = get_json("secret", "-n", self.ns, name)
            data = self.secrets_this_pass[name].get("data", {})
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                files[item["path"]] = base64.b64decode(data[item["key"]])
        return files

    def secret_volumes(self, ordinal, pod_spec):
        """Writes the pod's Secret volumes as a kubelet does, each file in the volume's
        directory (readable by its owner only), replaced whole when its Secret changes.
        Answers each mount path with the directory that stands for it."""
        container = pod_spec["containers"][0]
        volumes = {volume["name"]: volume for volume in pod_spec.get("volumes", [])}
        mounts = {}
        for mount in container.get("volumeMounts", []):
            files = self.volume_files(volumes.get(mount["name"], {}))
            if files is None:
                continue
            directory = self.workdir / f"voter-{ordinal}-{mount['name']}"
            directory.mkdir(mode=0o700, exist_ok=True)
            for key, content in files.items():
                path = directory / key
                if path.exists() and path.read_bytes() == content:
                    continue
                partial = directory / f".{key}.partial"
                partial.write_bytes(content)
                partial.chmod(0o600)
                partial.replace(path)
            mounts[mount["mountPath"]] = str(directory)
        return mounts

    def config_for(self, ordinal, pod_spec):
        release, ns = self.release, self.ns
        config_map = get_json("configmap", "-n", ns, f"{release}-config")
        text = config_map["data"][f"{release}-{ordinal}.toml"]
        for mount_path, directory in self.secret_volumes(ordinal, pod_spec).items():
            text = text.replace(f'"{mount_path}/', f'"{directory}/')
        for i in range(MAX_VOTERS):
            text = text.replace(f"{release}-{i}.{release}-headless.{ns}.svc", voter_ip(i))
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
        self.secrets_this_pass = {}  # each Secret read once per pass, for every voter
        pods = get_json(
            "pods", "-n", self.ns, "-l",
            f"app.kubernetes.io/instance={self.release},app.kubernetes.io/name=ursula-node",
        )
        live = {}
        for pod in pods["items"]:
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp"):
                continue
            ordinal = int(name.rsplit("-", 1)[1])
            live[ordinal] = (pod["metadata"]["uid"], pod["spec"])
        for ordinal in list(self.running):
            if ordinal not in live or live[ordinal][0] != self.running[ordinal][0]:
                self.stop_process(ordinal)
        for ordinal, (uid, pod_spec) in live.items():
            if ordinal in self.running:
                # A kubelet keeps Secret volumes up to date (a rotation).
                self.secret_volumes(ordinal, pod_spec)
                continue
            container = pod_spec["containers"][0]
            image = container["image"]
            if image == NEVER_READY:
                # The image crash-loops: nothing runs, and kwok never makes the pod ready.
                self.running[ordinal] = (uid, None)
                self.log.append((time.monotonic(), ordinal, f"cannot run {image}"))
                continue
            config = self.config_for(ordinal, pod_spec)
            with open(self.workdir / f"voter-{ordinal}.log", "ab") as logfile:
                process = subprocess.Popen(
                    [str(BIN_DIR / "ursula-node"), "--config", str(config)],
                    # The pod's environment, not the host's credentials.
                    env={
                        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                        **secret_env(container, self.ns),
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

    def wait_synced(self, voters=None):
        """Until a whole pass over the pods, started after this call, changed nothing: every
        voter pod has its process, and no process outlives its pod; with `voters`, until that
        many pods have theirs (a StatefulSet's pods can come after the test's first look)."""
        start = self.passes
        wait_for(
            "the test kubelet to catch up",
            lambda: self.passes >= start + 2
            and self.quiet
            and (voters is None or len(self.running) == voters),
            timeout=60,
            every=0.1,
        )

    def report(self, lines=15):
        """What a failed test prints about the voters: the kubelet's last steps and error, and
        each voter process's state and the end of its log."""
        disk = shutil.disk_usage(self.workdir)
        out = [
            f"kubelet: {self.log[-12:]}",
            f"kubelet error: {self.error!r}",
            f"load average: {os.getloadavg()}; disk free: {disk.free // 2**20} MiB",
        ]
        for ordinal, (_, process) in sorted(self.running.items()):
            state = "not run" if process is None else (
                "running" if process.poll() is None else f"exited {process.returncode}"
            )
            out.append(f"voter {ordinal}: {state}; end of its log:")
            log = self.workdir / f"voter-{ordinal}.log"
            if log.exists():
                out += log.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

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


def membership_steps():
    """`status.membershipStep` of the cluster at every write of it."""
    fmt = '{.status.membershipStep}{"\\n"}'
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
