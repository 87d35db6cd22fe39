"""Chart tests: real Helm rendering, Kubernetes schema validation, values schemas; and the
rules of the Dockerfiles in deploy/images."""

import pathlib
import unittest

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "charts" / "ursula-operator"
CLUSTER = ROOT / "charts" / "ursula"
KUBE_VERSION = "1.36.0"


def render(chart_dir, values=None, name="rel", namespace="ns"):
    chart = helm.Chart.load(chart_dir)
    chart.validate_schema(values or {})
    rendered = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        for document in yaml.safe_load_all(text):
            if document:
                objects.append((path, document))
    return chart, objects


def validate(obj):
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def ursulacluster_schema():
    crd = yaml.safe_load((ROOT / "crds" / "ursulacluster.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# The part of Istio's VirtualService the chart renders (field names and types as in Istio's
# CRD), strict: kubernetes-validate knows only built-in kinds, so the shape is checked here.
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
VIRTUAL_SERVICE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["networking.istio.io/v1beta1", "networking.istio.io/v1"]},
        "kind": {"const": "VirtualService"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["hosts", "http"],
            "properties": {
                "hosts": {**_STRINGS, "minItems": 1},
                "gateways": _STRINGS,
                "http": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["route", "retries"],
                        "properties": {
                            "name": {"type": "string"},
                            "route": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["destination"],
                                    "properties": {
                                        "destination": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["host"],
                                            "properties": {
                                                "host": {"type": "string", "minLength": 1},
                                                "port": {
                                                    "type": "object",
                                                    "additionalProperties": False,
                                                    "required": ["number"],
                                                    "properties": {"number": {"type": "integer"}},
                                                },
                                            },
                                        },
                                    },
                                },
                            },
                            "retries": {
                                "type": "object",
                                "properties": {"attempts": {"type": "integer"}},
                            },
                            # Istio's CRD: a duration of at least 1ms ("0s" is refused).
                            "timeout": {"type": "string", "pattern": "^[1-9][0-9]*(ms|s|m|h)$"},
                        },
                    },
                },
            },
        },
    },
}


class OperatorChart(unittest.TestCase):
    def test_renders_valid_objects_with_least_privilege(self):
        chart, objects = render(OPERATOR)
        kinds = sorted(obj["kind"] for _, obj in objects)
        self.assertEqual(
            kinds, ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
        )
        for path, obj in objects:
            with self.subTest(path=path):
                validate(obj)
        role = next(obj for _, obj in objects if obj["kind"] == "ClusterRole")
        for rule in role["rules"]:
            self.assertNotIn("*", rule["verbs"], rule)
            self.assertNotIn("*", rule["resources"], rule)
            # The cluster's own Secrets (admin token, CA, certificates): read one by name,
            # create and update; never list or watch every Secret.
            if "secrets" in rule["resources"]:
                self.assertEqual(rule["resources"], ["secrets"], rule)
                self.assertEqual(sorted(rule["verbs"]), ["create", "get", "patch"], rule)
        deployment = next(obj for _, obj in objects if obj["kind"] == "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertEqual(pod["containers"][0]["image"], "ursula/ursula-operator:0.1.0")
        self.assertEqual(pod["containers"][0]["args"], ["--ready-timeout", "600"])

    def test_the_ready_timeout_reaches_the_operator(self):
        _, objects = render(OPERATOR, {"readyTimeoutSeconds": 120})
        deployment = next(obj for _, obj in objects if obj["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(container["args"], ["--ready-timeout", "120"])

    def test_ships_the_generated_crds_and_they_are_valid(self):
        chart = helm.Chart.load(OPERATOR)
        shipped = {crd["filename"].split("/")[-1]: crd["data"] for crd in chart.crds}
        for name in ["ursulacluster.yaml", "bucketpurge.yaml"]:
            with self.subTest(crd=name):
                generated = (ROOT / "crds" / name).read_text()
                self.assertEqual(shipped.get(name), generated, "charts/ursula-operator/crds is stale")
                validate(yaml.safe_load(generated))

    def test_values_schema_rejects_bad_values(self):
        chart = helm.Chart.load(OPERATOR)
        for bad in [
            {"replicas": 2},
            {"logLevel": "loud"},
            {"imageTag": "x"},
            {"readyTimeoutSeconds": 1},
            {"readyTimeoutSeconds": "ten"},
        ]:
            with self.subTest(values=bad), self.assertRaises(helm.HelmValuesError):
                chart.validate_schema(bad)

    def test_lints_clean(self):
        report = helm.lint(OPERATOR, strict=True)
        self.assertEqual([m for m in report["messages"] if m["severity"] >= 2], [])


class ClusterChart(unittest.TestCase):
    def test_default_renders_a_valid_ursulacluster(self):
        _, objects = render(CLUSTER, name="streams")
        self.assertEqual([obj["kind"] for _, obj in objects], ["UrsulaCluster"])
        cluster = objects[0][1]
        jsonschema.validate(cluster, ursulacluster_schema())
        self.assertEqual(cluster["spec"]["version"], "0.1.0")
        self.assertEqual(cluster["spec"]["voters"], 3)

    def test_upgrade_sets_the_version_and_overrides_reach_the_spec(self):
        _, objects = render(
            CLUSTER,
            {"version": "0.7.3", "voters": 5, "nodeConfig": {"server.long_poll_timeout": "30s"},
             "storage": {"size": "50Gi", "className": "fast"}},
        )
        spec = objects[0][1]["spec"]
        jsonschema.validate(objects[0][1], ursulacluster_schema())
        self.assertEqual(
            (spec["version"], spec["voters"], spec["storage"]["className"]),
            ("0.7.3", 5, "fast"),
        )
        self.assertEqual(spec["nodeConfig"], {"server.long_poll_timeout": "30s"})

    def test_volume_reclaim_reaches_the_spec(self):
        for values, expected in [({}, "Retain"), ({"volumeReclaim": "Delete"}, "Delete")]:
            _, objects = render(CLUSTER, values)
            jsonschema.validate(objects[0][1], ursulacluster_schema())
            self.assertEqual(objects[0][1]["spec"]["volumeReclaim"], expected, values)

    def test_an_object_store_reaches_the_spec(self):
        store = {"bucket": "ursula-cold", "endpoint": "http://minio.storage:9000",
                 "credentialsSecret": "ursula-s3"}
        _, objects = render(CLUSTER, {"objectStore": store})
        jsonschema.validate(objects[0][1], ursulacluster_schema())
        self.assertEqual(objects[0][1]["spec"]["objectStore"], store)
        _, objects = render(CLUSTER)
        self.assertNotIn("objectStore", objects[0][1]["spec"])

    def test_gateway_options_reach_the_spec(self):
        options = {"maxBufferedBodySize": 1048576, "maxBufferedSnapshotSize": 536870912,
                   "requestTimeout": "30s", "accessKeysSecret": "ursula-keys"}
        _, objects = render(CLUSTER, {"gateway": options})
        jsonschema.validate(objects[0][1], ursulacluster_schema())
        self.assertEqual(objects[0][1]["spec"]["gateway"], options)
        _, objects = render(CLUSTER)
        self.assertNotIn("gateway", objects[0][1]["spec"])

    def test_a_cert_manager_issuer_reaches_the_spec(self):
        issuer = {"name": "ursula-ca", "kind": "ClusterIssuer"}
        _, objects = render(CLUSTER, {"tls": {"issuerRef": issuer}})
        jsonschema.validate(objects[0][1], ursulacluster_schema())
        self.assertEqual(objects[0][1]["spec"]["tls"], {"issuerRef": issuer})
        _, objects = render(CLUSTER)
        self.assertNotIn("tls", objects[0][1]["spec"], "the operator's own CA by default")

    def test_the_tls_ingress_never_retries(self):
        _, objects = render(
            CLUSTER,
            {"ingress": {"enabled": True, "host": "streams.example.com", "tlsSecretName": "tls"}},
            name="streams",
        )
        ingress = next(obj for _, obj in objects if obj["kind"] == "Ingress")
        validate(ingress)
        annotations = ingress["metadata"]["annotations"]
        self.assertEqual(annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"], "off")
        self.assertEqual(ingress["spec"]["tls"][0]["secretName"], "tls")
        backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
        self.assertEqual((backend["name"], backend["port"]["number"]), ("streams", 4437))


    def virtual_services(self, istio, namespace="prod"):
        _, objects = render(CLUSTER, {"istio": {"virtualService": istio}}, name="streams",
                            namespace=namespace)
        services = {obj["metadata"]["name"]: obj for _, obj in objects
                    if obj["kind"] == "VirtualService"}
        for name, service in services.items():
            with self.subTest(virtual_service=name):
                jsonschema.validate(service, VIRTUAL_SERVICE)
                self.assertEqual(service["metadata"]["namespace"], namespace)
                for route in service["spec"]["http"]:
                    self.assertEqual(route["retries"], {"attempts": 0}, "Istio must not resend")
        return services

    def test_the_istio_virtual_services_are_off_by_default(self):
        _, objects = render(CLUSTER, name="streams")
        self.assertNotIn("VirtualService", [obj["kind"] for _, obj in objects])
        self.assertEqual(self.virtual_services({"enabled": False, "hosts": ["x.example.com"]}), {})

    def test_the_istio_virtual_services_never_retry_on_either_side_of_the_gateway(self):
        services = self.virtual_services({
            "enabled": True,
            "hosts": ["streams.example.com"],
            "gateways": ["mesh", "istio-system/public"],
        })
        self.assertEqual(sorted(services), ["streams", "streams-headless"])
        # Clients to the gateways: the gateways' Service (named after the cluster), port 4437.
        front = services["streams"]["spec"]
        self.assertEqual(
            front["hosts"], ["streams.prod.svc.cluster.local", "streams.example.com"]
        )
        self.assertEqual(front["gateways"], ["mesh", "istio-system/public"])
        self.assertEqual(
            [r["destination"] for route in front["http"] for r in route["route"]],
            [{"host": "streams.prod.svc.cluster.local", "port": {"number": 4437}}],
        )
        # The gateways to the voters: their headless Service, whose per-voter names are the
        # gateways' upstreams; sidecars only, to whichever port was addressed.
        back = services["streams-headless"]["spec"]
        self.assertEqual(back["hosts"], ["streams-headless.prod.svc.cluster.local"])
        self.assertEqual(back["gateways"], ["mesh"])
        self.assertEqual(
            [r["destination"] for route in back["http"] for r in route["route"]],
            [{"host": "streams-headless.prod.svc.cluster.local"}],
        )
        # No timeout unless one is set, so long-polls and SSE are never cut.
        for service in services.values():
            for route in service["spec"]["http"]:
                self.assertNotIn("timeout", route)

    def test_the_istio_timeout_and_cluster_domain_reach_every_route(self):
        services = self.virtual_services(
            {"enabled": True, "timeout": "3600s", "clusterDomain": "corp.internal"},
            namespace="ns",
        )
        self.assertEqual(
            {name: s["spec"]["hosts"] for name, s in services.items()},
            {"streams": ["streams.ns.svc.corp.internal"],
             "streams-headless": ["streams-headless.ns.svc.corp.internal"]},
        )
        for service in services.values():
            for route in service["spec"]["http"]:
                self.assertEqual(route["timeout"], "3600s")

    def test_values_schema_rejects_bad_values(self):
        chart = helm.Chart.load(CLUSTER)
        for bad in [
            {"voters": 4},
            {"voters": 0},
            {"volumeReclaim": "Recycle"},
            {"storage": {"size": "ten gigabytes"}},
            {"gatewayReplicas": 0},
            {"unknownKey": True},
            {"objectStore": {"bucket": "cold"}},
            {"objectStore": {"bucket": "cold", "credentialsSecret": "s3", "endpoint": "minio:9000"}},
            {"gateway": {"maxBufferedBodySize": 0}},
            {"gateway": {"requestTimeout": "soon"}},
            {"gateway": {"accessKeys": "x"}},
            {"istio": {"virtualService": {"enabled": "yes"}}},
            {"istio": {"virtualService": {"timeout": "0s"}}},
            {"istio": {"virtualService": {"timeout": "forever"}}},
            {"istio": {"virtualService": {"hosts": "streams.example.com"}}},
            {"istio": {"virtualService": {"gateways": [""]}}},
            {"istio": {"virtualService": {"retries": {"attempts": 2}}}},
            {"istio": {"gateway": {}}},
            {"tls": {"issuerRef": {}}},
            {"tls": {"issuerRef": {"name": ""}}},
            {"tls": {"issuer": "ursula-ca"}},
        ]:
            with self.subTest(values=bad), self.assertRaises(helm.HelmValuesError):
                chart.validate_schema(bad)

    def test_the_crd_itself_refuses_four_voters(self):
        _, objects = render(CLUSTER)
        cluster = objects[0][1]
        cluster["spec"]["voters"] = 4
        with self.assertRaises(jsonschema.ValidationError):
            jsonschema.validate(cluster, ursulacluster_schema())

    def test_lints_clean(self):
        report = helm.lint(CLUSTER, strict=True)
        self.assertEqual([m for m in report["messages"] if m["severity"] >= 2], [])


class PlainManifests(unittest.TestCase):
    def test_every_kustomization_resource_is_valid_and_the_crds_are_current(self):
        deploy = ROOT / "deploy"
        kustomization = yaml.safe_load((deploy / "kustomization.yaml").read_text())
        kinds = []
        for resource in kustomization["resources"]:
            for obj in yaml.safe_load_all((deploy / resource).read_text()):
                with self.subTest(resource=resource):
                    validate(obj)
                    kinds.append(obj["kind"])
        self.assertEqual(kinds.count("CustomResourceDefinition"), 2)
        self.assertIn("Deployment", kinds)
        for name in ["ursulacluster.yaml", "bucketpurge.yaml"]:
            self.assertEqual(
                (deploy / "crds" / name).read_text(),
                (ROOT / "crds" / name).read_text(),
                f"deploy/crds/{name} is stale",
            )
        # The plain RBAC is the chart's.
        _, objects = render(OPERATOR, name="ursula-operator", namespace="ursula-system")
        chart_role = next(obj for _, obj in objects if obj["kind"] == "ClusterRole")
        plain_role = next(
            obj for obj in yaml.safe_load_all((deploy / "operator" / "rbac.yaml").read_text())
            if obj["kind"] == "ClusterRole"
        )
        self.assertEqual(plain_role["rules"], chart_role["rules"])

    def test_examples_match_their_crds(self):
        schemas = {}
        for name in ["ursulacluster.yaml", "bucketpurge.yaml"]:
            crd = yaml.safe_load((ROOT / "crds" / name).read_text())
            schemas[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"][
                "openAPIV3Schema"
            ]
        examples = list(
            yaml.safe_load_all((ROOT / "deploy" / "examples" / "ursulacluster.yaml").read_text())
        )
        self.assertEqual(sorted(e["kind"] for e in examples), ["BucketPurge", "UrsulaCluster"])
        for example in examples:
            jsonschema.validate(example, schemas[example["kind"]])



class Images(unittest.TestCase):
    """The Dockerfiles (not built here: no registry): multi-stage, a slim final base, a
    non-root user, the contract's ports, no HEALTHCHECK (probes are Kubernetes'), the
    workspace's Rust version, and an entrypoint that is a binary the build makes."""

    PORTS = {"node": {4437, 4438, 4439}, "gateway": {4437, 4438}, "operator": set()}

    @staticmethod
    def instructions(path):
        lines, current = [], ""
        for raw in path.read_text().splitlines():
            if raw.lstrip().startswith("#"):
                continue
            current += raw.rstrip("\\").strip() + " "
            if not raw.rstrip().endswith("\\"):
                if current.strip():
                    word, _, rest = current.strip().partition(" ")
                    lines.append((word.upper(), rest.strip()))
                current = ""
        return lines

    def test_every_image_follows_the_rules(self):
        cargo = (ROOT / "Cargo.toml").read_text()
        rust_version = cargo.split('rust-version = "', 1)[1].split('"', 1)[0]
        for image, ports in self.PORTS.items():
            with self.subTest(image=image):
                steps = self.instructions(ROOT / "deploy" / "images" / f"{image}.Dockerfile")
                froms = [rest for word, rest in steps if word == "FROM"]
                self.assertGreaterEqual(len(froms), 2, "multi-stage")
                self.assertTrue(froms[0].startswith(f"rust:{rust_version}"), froms[0])
                final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
                self.assertRegex(froms[-1], r"slim|distroless|scratch|static", "a small base")
                users = [rest for word, rest in final if word == "USER"]
                self.assertTrue(users and users[-1].isdigit() and int(users[-1]) != 0, users)
                exposed = {int(p) for word, rest in final if word == "EXPOSE" for p in rest.split()}
                self.assertEqual(exposed, ports)
                self.assertNotIn("HEALTHCHECK", [word for word, _ in steps])
                entry = [rest for word, rest in final if word == "ENTRYPOINT"][-1]
                binary = entry.strip('[]" ').rsplit("/", 1)[-1]
                self.assertEqual(binary, f"ursula-{image}")
                built = [rest for word, rest in steps if word == "RUN" and "cargo build" in rest]
                self.assertTrue(built and f"--bin {binary}" in built[0], built)
                crate = (ROOT / image / "Cargo.toml").read_text()
                self.assertIn(f'name = "{binary}"', crate, "the binary is one of the crate's")

if __name__ == "__main__":
    unittest.main()
