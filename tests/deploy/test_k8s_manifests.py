"""deploy/k8s: the kustomize base and the example overlay build offline, every
document is valid for every Kubernetes version claimed (kubernetes-validate)
or against our CRDs, and the output has the properties an operator relies
on (replicas, leader election, probes on the health ports, limits, security
contexts, PDBs, HPA, NATS on a volume with users and TLS, no admin port on a
Service, network policies)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from .k8s import EXAMPLE, K8S, KUBE_VERSIONS, REPO, SERVICES, build, container, of_kind

GATEWAY = K8S / "overlays" / "gateway"
BUILT = {"base": K8S, "example": EXAMPLE, "gateway": GATEWAY}


def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    out = {}
    for d in of_kind(build(K8S), "CustomResourceDefinition").values():
        schema = d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        out[(d["spec"]["group"], d["spec"]["names"]["kind"])] = jsonschema.Draft7Validator(schema)
    return out


def group_of(doc: dict[str, Any]) -> str:
    api = doc["apiVersion"]
    return api.split("/")[0] if "/" in api else ""


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("which", sorted(BUILT))
def test_every_document_is_valid_for_the_claimed_kubernetes_versions(which: str, version: str) -> None:
    crds = crd_validators()
    checked = 0
    for doc in build(BUILT[which]):
        key = (group_of(doc), doc["kind"])
        where = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
        if key in crds:
            errors = [e.message for e in crds[key].iter_errors(doc)]
            assert errors == [], where
        elif key in (("gateway.networking.k8s.io", "HTTPRoute"), ("gateway.networking.k8s.io", "ReferenceGrant")):
            continue  # the Gateway API's own CRDs: checked in test_example_httproute_targets_the_pool
        else:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")
        checked += 1
    assert checked > 30


def test_the_base_has_every_piece() -> None:
    docs = build(K8S)
    assert set(of_kind(docs, "CustomResourceDefinition")) == {
        "inferencepolicies.kinference.buoyant.io", "inferencepools.kinference.buoyant.io",
        "inferenceworkersets.kinference.buoyant.io", "inferenceproviders.kinference.buoyant.io",
        "inferencepools.inference.networking.k8s.io"}
    deployments = of_kind(docs, "Deployment")
    assert set(deployments) == set(SERVICES)
    assert deployments["router"]["spec"]["replicas"] == 2
    assert deployments["policy-compiler"]["spec"]["replicas"] == 2
    assert deployments["telemetry-collector"]["spec"]["replicas"] >= 2  # replicas share the fleet
    assert set(of_kind(docs, "ServiceAccount")) == set(SERVICES)
    assert set(of_kind(docs, "Service")) >= {*SERVICES, "nats"}
    namespaced = [d for d in docs if d["kind"] not in
                  ("CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {d["metadata"].get("namespace") for d in namespaced} == {"kinference-system"}


def test_the_compiler_elects_a_leader_with_the_contract_flags() -> None:
    args = container(of_kind(build(K8S), "Deployment")["policy-compiler"])["args"]
    assert args[args.index("--source") + 1] == "kubernetes"
    assert "--leader-elect" in args
    assert args[args.index("--lease-name") + 1] == "kinference-policy-compiler"
    env = {e["name"]: e for e in container(of_kind(build(K8S), "Deployment")["policy-compiler"])["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "--source" in container(of_kind(build(K8S), "Deployment")["router"])["args"]
    assert "--source" in container(of_kind(build(K8S), "Deployment")["telemetry-collector"])["args"]


def test_the_classifier_scales_with_an_hpa() -> None:
    (hpa,) = of_kind(build(K8S), "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "classifier"}
    assert 1 < hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    # CPU utilisation needs a CPU request to be measured against
    assert container(of_kind(build(K8S), "Deployment")["classifier"])["resources"]["requests"]["cpu"]


HEALTH_PORTS = {"router": 8081, "policy-compiler": 8090, "telemetry-collector": 9090, "classifier": 8083}


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("service", SERVICES)
def test_probes_on_the_health_port_that_the_service_listens_on(service: str) -> None:
    d = of_kind(build(K8S), "Deployment")[service]
    c = container(d)
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert port_number(c, get["port"]) == HEALTH_PORTS[service], probe
        assert get["path"] in ("/healthz", "/readyz")
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the port the probe hits is the one the process binds, on every address
    listen = {"router": ("--admin-port", "--admin-host"), "classifier": ("--health-port", "--health-host")}.get(
        service, ("--http-port", "--http-host"))
    assert flag(c["args"], listen[0]) == str(HEALTH_PORTS[service])
    assert flag(c["args"], listen[1]) == "0.0.0.0"


@pytest.mark.parametrize("which", sorted(BUILT))
def test_every_kinference_container_names_its_entry_point(which: str) -> None:
    """The image's CMD is ``kinference-router --help``: a container that gave
    only ``args`` would run its first flag as the program. Each one names the
    console script of its service (pyproject's [project.scripts]); the
    simulators give a whole ``python -m ...`` command line as args."""
    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    seen = 0
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(build(BUILT[which]), kind).items():
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1] != "kinference":
                    continue
                seen += 1
                argv = c.get("command") or c.get("args") or []
                assert argv and not argv[0].startswith("-"), f"{kind} {name} runs {argv[:1]}"
                if c.get("command"):
                    assert argv[0] in scripts or argv[0] == "python", f"{kind} {name}: {argv[0]}"
                if name in SERVICES:
                    assert c["command"][0] == f"kinference-{name}", name
    assert seen >= len(SERVICES)


@pytest.mark.parametrize("which", sorted(BUILT))
def test_every_kinference_container_runs_the_image_the_kustomization_names(which: str) -> None:
    """Every container of the Kinference image gets the ``images:`` entry of
    its kustomization (``kustomize edit set image``): a bare ``kinference``
    would be pulled from Docker Hub (the gateway overlay's Endpoint Picker did)."""
    images = {}
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(build(BUILT[which]), kind).items():
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1] == "kinference":
                    images[f"{kind} {name}"] = c["image"]
    assert images and set(images.values()) == {"localhost/kinference:0.1.0"}, images


@pytest.mark.parametrize("which", sorted(BUILT))
def test_every_service_pod_is_scraped_on_a_port_that_serves_metrics(which: str) -> None:
    """docs/operations.md: every pod is annotated for Prometheus. A router
    (or Endpoint Picker) scraped on its data port serves /metrics there only
    with --metrics-on-data-port (the gateway overlay's picker had neither)."""
    seen = 0
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(build(BUILT[which]), kind).items():
            template = d["spec"]["template"]
            for c in template["spec"]["containers"]:
                if not (c.get("command") or [""])[0].startswith("kinference-"):
                    continue
                seen += 1
                notes = template["metadata"].get("annotations", {})
                assert notes.get("prometheus.io/scrape") == "true" and notes.get("prometheus.io/path") == "/metrics", name
                if c["command"][0] == "kinference-router":
                    args = c.get("args", [])
                    port = args[args.index("--port") + 1] if "--port" in args else "8080"
                    if notes["prometheus.io/port"] == port:
                        assert "--metrics-on-data-port" in args, name
    assert seen


def pod_specs(which: str) -> list[tuple[str, dict[str, Any]]]:
    docs = build(BUILT[which])
    out = []
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(docs, kind).items():
            out.append((name, d["spec"]["template"]["spec"]))
    return out


@pytest.mark.parametrize("which", sorted(BUILT))
def test_every_pod_is_locked_down_and_sized(which: str) -> None:
    for name, spec in pod_specs(which):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], name
            assert sc.get("privileged", False) is False, name
            for k in ("requests", "limits"):
                assert set(c["resources"][k]) == {"cpu", "memory"}, (name, k)
            assert "readinessProbe" in c and "livenessProbe" in c, name


def test_pod_disruption_budgets_cover_every_replicated_service() -> None:
    docs = build(K8S)
    pdbs = of_kind(docs, "PodDisruptionBudget")
    for name, d in of_kind(docs, "Deployment").items():
        if d["spec"]["replicas"] > 1:
            pdb = pdbs[name]
            assert pdb["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
            # a drain can still proceed, and takes at most what the others can cover
            if "maxUnavailable" in pdb["spec"]:
                assert pdb["spec"]["maxUnavailable"] == 1, name
            else:
                assert pdb["spec"]["minAvailable"] < d["spec"]["replicas"], name


def test_each_collector_replica_is_named_after_its_pod() -> None:
    """The replicas' ids must differ and outlive no pod: the pod name, from the downward API."""
    c = container(of_kind(build(K8S), "Deployment")["telemetry-collector"])
    assert flag(c["args"], "--replica-id") == "$(POD_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_router_service_exposes_only_the_data_port() -> None:
    svc = of_kind(build(K8S), "Service")["router"]
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(8080, "http")]
    c = container(of_kind(build(K8S), "Deployment")["router"])
    assert port_number(c, "http") == 8080 and flag(c["args"], "--port") == "8080"
    for s in of_kind(build(K8S), "Service").values():
        assert all(p["port"] != 8081 for p in s["spec"]["ports"])


def nats_conf() -> str:
    (cm,) = [d for n, d in of_kind(build(K8S), "ConfigMap").items() if n.startswith("nats-config")]
    sts = of_kind(build(K8S), "StatefulSet")["nats"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]  # the hashed name, followed
    return cm["data"]["nats.conf"]


def test_nats_is_a_statefulset_with_jetstream_on_a_volume() -> None:
    sts = of_kind(build(K8S), "StatefulSet")["nats"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    c = container(sts)
    mount = next(m for m in c["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    store = re.search(r"store_dir:\s*(\S+)", nats_conf()).group(1)
    assert store.startswith(mount["mountPath"] + "/")
    assert claim["spec"]["resources"]["requests"]["storage"]


def test_nats_requires_tls_and_a_user_per_service() -> None:
    conf = nats_conf()
    assert re.search(r"^tls \{", conf, re.M)
    clients = conf.split("\nauthorization {", 1)[1]  # the clients' users (the routes have their own)
    users = [u.strip('"') for u in re.findall(r"user:\s*(\S+)", clients)]
    assert sorted(users) == sorted([*SERVICES, "observer"])
    sts = of_kind(build(K8S), "StatefulSet")["nats"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(sts)["env"] if "secretKeyRef" in
           e.get("valueFrom", {})}
    for user in [*SERVICES, "observer"]:
        var = user.upper().replace("-", "_") + "_PASSWORD"
        assert f"password: ${var}" in conf
        assert env[var] == {"name": "kinference-nats-auth", "key": user}


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_connects_as_its_own_user_over_tls(service: str) -> None:
    d = of_kind(build(K8S), "Deployment")[service]
    c = container(d)
    args = c["args"]
    # every server of the cluster, each verified by its own name
    replicas = of_kind(build(K8S), "StatefulSet")["nats"]["spec"]["replicas"]
    assert flag(args, "--nats-url").split(",") == [
        f"tls://nats-{i}.nats-headless.kinference-system.svc:4222" for i in range(replicas)]
    assert flag(args, "--nats-user") == service
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    pw = flag(args, "--nats-password-file")
    secret = volumes[mounts[pw.rsplit("/", 1)[0]]]["secret"]
    # only its own password is in its pod
    assert secret == {"secretName": "kinference-nats-auth", "items": [{"key": service, "path": "password"}]}
    ca = flag(args, "--nats-tls-ca")
    assert volumes[mounts[ca.rsplit("/", 1)[0]]]["secret"]["secretName"] == "kinference-nats-tls"


def selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    sel = policy["spec"]["podSelector"]
    if any(labels.get(k) != v for k, v in sel.get("matchLabels", {}).items()):
        return False
    for e in sel.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def pod_labels() -> dict[str, dict[str, str]]:
    docs = build(K8S)
    out = {}
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(docs, kind).items():
            out[name] = d["spec"]["template"]["metadata"]["labels"]
    return out


def test_network_policies_deny_by_default() -> None:
    pols = of_kind(build(K8S), "NetworkPolicy")
    deny = pols["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny


def test_only_the_router_reaches_outside_the_cluster() -> None:
    pols = of_kind(build(K8S), "NetworkPolicy").values()
    for name, labels in pod_labels().items():
        for pol in pols:
            if not selects(pol, labels):
                continue
            for rule in pol["spec"].get("egress", []):
                if not any("ipBlock" in peer for peer in rule.get("to", [])) and rule.get("to"):
                    continue
                if name == "router":
                    continue
                # anything else reaches off-cluster addresses only on the API server's ports
                ports = {p["port"] for p in rule.get("ports", [])}
                assert ports and ports <= {443, 6443}, (name, pol["metadata"]["name"])
    router_out = [peer for pol in pols if selects(pol, pod_labels()["router"])
                  for rule in pol["spec"].get("egress", []) if not rule.get("ports")
                  for peer in rule.get("to", [])]
    assert {"ipBlock": {"cidr": "0.0.0.0/0"}} in router_out


def test_only_the_services_reach_nats() -> None:
    pols = of_kind(build(K8S), "NetworkPolicy").values()
    nats = pod_labels()["nats"]
    ingress = [rule for pol in pols if selects(pol, nats) for rule in pol["spec"].get("ingress", [])]
    assert ingress, "a policy must admit the services"
    routes = 0
    for rule in ingress:
        assert rule.get("from"), "an ingress rule without `from` admits everyone"
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}  # this namespace's pods only
            if peer["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": "nats"}:
                # the servers reach each other's routes, and only those
                assert rule["ports"] == [{"protocol": "TCP", "port": 6222}]
                routes += 1
                continue
            (expr,) = peer["podSelector"]["matchExpressions"]
            assert expr["key"] == "app.kubernetes.io/name" and sorted(expr["values"]) == sorted(SERVICES)
            assert rule["ports"] == [{"protocol": "TCP", "port": 4222}]
    assert routes == 1
    egress = [rule for pol in pols if selects(pol, nats) for rule in pol["spec"].get("egress", [])]
    assert {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}],
            "ports": [{"protocol": "TCP", "port": 6222}]} in egress


def test_nats_is_a_cluster_of_three_that_loses_one_at_most() -> None:
    docs = build(K8S)
    sts = of_kind(docs, "StatefulSet")["nats"]
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "nats-headless"
    assert of_kind(docs, "Service")["nats-headless"]["spec"]["publishNotReadyAddresses"] is True
    (pdb,) = [d for d in of_kind(docs, "PodDisruptionBudget").values()
              if d["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "nats"}]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    c = container(sts)
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"  # started = caught up with the cluster
    # the cluster block: routes to each server through the headless Service, with a password and mutual TLS
    conf = nats_conf()
    block = re.search(r"^cluster \{\n(.*?)\n\}", conf, re.M | re.S).group(1)
    assert re.search(r"routes: \[\$NATS_ROUTE_0, \$NATS_ROUTE_1, \$NATS_ROUTE_2\]", block)
    assert "password: $ROUTE_PASSWORD" in block and "verify: true" in block and "no_advertise: true" in block
    env = {e["name"]: e for e in c["env"]}
    assert env["ROUTE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kinference-nats-auth", "key": "route"}
    names = [e["name"] for e in c["env"]]
    for i in range(3):
        assert env[f"NATS_ROUTE_{i}"]["value"] == (
            f"nats-route://route:$(ROUTE_PASSWORD)@nats-{i}.nats-headless.kinference-system.svc:6222")
        assert names.index("ROUTE_PASSWORD") < names.index(f"NATS_ROUTE_{i}")  # $(...) expands earlier vars only
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    route_tls = re.search(r"cert_file: (/etc/[^/]+)/tls.crt", block).group(1)
    assert volumes[mounts[route_tls]]["secret"]["secretName"] == "kinference-nats-routes-tls"
    # the services that create buckets or streams create them at three replicas
    for service in ("policy-compiler", "telemetry-collector", "router"):
        args = container(of_kind(docs, "Deployment")[service])["args"]
        assert flag(args, "--kv-replicas") == str(spec["replicas"])


def test_the_router_admin_port_takes_no_connections_from_the_network() -> None:
    pols = of_kind(build(K8S), "NetworkPolicy").values()
    router = pod_labels()["router"]
    ports = [p["port"] for pol in pols if selects(pol, router)
             for rule in pol["spec"].get("ingress", []) for p in rule.get("ports", [])]
    assert ports == [8080]
    for pol in pols:
        if selects(pol, router):
            assert all(rule.get("ports") for rule in pol["spec"].get("ingress", []))


def test_the_example_overlay_runs_its_three_nats_servers_on_one_node() -> None:
    """HA trial: on a one-node kind or minikube cluster (which getting
    started names) the example overlay kept base's required anti-affinity,
    so two NATS servers stayed Pending, JetStream had no quorum and the
    routers never got a configuration. The example prefers one server per
    node; base still requires it."""
    example = of_kind(build(EXAMPLE), "StatefulSet")["nats"]["spec"]["template"]["spec"]["affinity"]
    anti = example["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (pref,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    base = of_kind(build(K8S), "StatefulSet")["nats"]["spec"]["template"]["spec"]["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in base["podAntiAffinity"]


def test_example_overlay_is_the_repository_examples() -> None:
    for src, copy in (("00-fleet.yaml", "fleet.yaml"), ("10-burst-policy.yaml", "policy.yaml"),
                      ("20-pool.yaml", "pool.yaml")):
        assert (EXAMPLE / copy).read_text() == (REPO / "deploy" / "examples" / src).read_text(), copy
    docs = build(EXAMPLE)
    provider = of_kind(docs, "InferenceProvider")["databricks"]
    assert provider["spec"]["url"] == "http://provider-sim.default.svc:8300/v1"
    secret = of_kind(docs, "Secret")[provider["spec"]["auth"]["secretRef"]["name"]]
    assert provider["spec"]["auth"]["secretRef"]["key"] in secret["stringData"]
    # each worker set selects simulated pods, which listen on its port
    for ws in of_kind(docs, "InferenceWorkerSet").values():
        sel = ws["spec"]["selector"]["matchLabels"]
        pods = [d for d in of_kind(docs, "Deployment").values()
                if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        assert pods, ws["metadata"]["name"]
        assert all(container(p)["ports"][0]["containerPort"] == ws["spec"]["port"] for p in pods)


def test_example_httproute_targets_the_pool() -> None:
    """The router's route table names the pool and attaches to no Gateway (no
    Gateway can send to a kinference.buoyant.io pool); the Gateway's route
    sends the same requests to the router's Service, granted across namespaces."""
    docs = build(EXAMPLE)
    routes = of_kind(docs, "HTTPRoute")
    table, gateway = routes["inference-all"], routes["inference-gateway"]
    assert table["apiVersion"] == gateway["apiVersion"] == "gateway.networking.k8s.io/v1"
    pools = of_kind(docs, "InferencePool")
    refs = [b for rule in table["spec"]["rules"] for b in rule["backendRefs"]]
    assert refs == [{"group": "kinference.buoyant.io", "kind": "InferencePool", "name": "inference-all"}]
    assert pools["inference-all"]["metadata"]["namespace"] == table["metadata"]["namespace"]
    assert "parentRefs" not in table["spec"] and table["spec"]["hostnames"]
    [ref] = [b for rule in gateway["spec"]["rules"] for b in rule["backendRefs"]]
    router = of_kind(docs, "Service")["router"]
    assert (ref["kind"], ref["name"], ref["namespace"], ref["port"]) == (
        "Service", "router", router["metadata"]["namespace"], router["spec"]["ports"][0]["port"])
    assert gateway["spec"]["hostnames"] == table["spec"]["hostnames"] and gateway["spec"]["parentRefs"]
    [grant] = of_kind(docs, "ReferenceGrant").values()
    assert grant["metadata"]["namespace"] == "kinference-system"
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": "router"}]


def test_gateway_overlay_wires_the_endpoint_picker_to_an_inference_extension_pool(tmp_path) -> None:
    from kinference_common.compiler import compile_documents
    from kinference_common.manifests import load_text

    docs = build(GATEWAY)
    epp = of_kind(docs, "Deployment")["kinference-epp"]
    c = container(epp)
    args = c["args"]
    assert args[args.index("--epp-port") + 1] == "9002" and args[args.index("--egress-port") + 1] == "8082"
    assert args[args.index("--epp-host") + 1] == "0.0.0.0"
    assert {e["name"]: e.get("valueFrom") for e in c["env"]}["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert c["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    svc = of_kind(docs, "Service")["kinference-epp"]
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["port"] == 9002 and ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert ports["egress"]["port"] == 8082
    [pool] = [d for d in docs if d["apiVersion"] == "inference.networking.k8s.io/v1"]
    ref = pool["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"], ref["failureMode"]) == ("kinference-epp", 9002, "FailClose")
    assert pool["metadata"]["namespace"] == svc["metadata"]["namespace"] == epp["metadata"]["namespace"]
    assert args[args.index("--pool") + 1] == f"{pool['metadata']['namespace']}/{pool['metadata']['name']}"
    route = of_kind(docs, "HTTPRoute")["qwen"]
    assert [b["group"] for rule in route["spec"]["rules"] for b in rule["backendRefs"]] == [
        "inference.networking.k8s.io"]
    # the pool compiles with its policy and the worker set its selector covers; the EPP Service resolves
    res = compile_documents(load_text(yaml.safe_dump_all(
        [d for d in docs if d["kind"] not in ("CustomResourceDefinition",)]), "gateway.yaml"),
        services_visible=True)
    compiled = res.pools[("default", "qwen")]
    assert compiled.policy.name == "burst-unless-pii"
    assert sorted(d.name for d in compiled.destinations) == ["databricks", "qwen-2-5-32b"]
    # the only warning: the Gateway is yours, not in the overlay
    assert [w.code for w in res.document_warnings if w.name == "qwen"] == ["ParentNotFound"]


def test_the_example_compiles_without_errors(tmp_path) -> None:
    """The example's Kinference objects, as the cluster would hold them, lint clean."""
    from kinfctl.main import main

    docs = [d for d in build(EXAMPLE) if group_of(d) == "kinference.buoyant.io" and d["kind"] != "CustomResourceDefinition"]
    (tmp_path / "example.yaml").write_text(yaml.safe_dump_all(docs))
    assert main(["lint", "--strict", str(tmp_path / "example.yaml")]) == 0


def test_make_secrets_prints_valid_secrets_the_pods_use() -> None:
    import subprocess

    out = subprocess.run(["sh", str(K8S / "make-secrets.sh"), "--print"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    made = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out) if d}
    for doc in made.values():
        kubernetes_validate.validate(doc, KUBE_VERSIONS[0], strict=True)
        assert doc["metadata"]["namespace"] == "kinference-system"
    for name in ("kinference-nats-tls", "kinference-nats-routes-tls"):
        assert made[name]["type"] == "kubernetes.io/tls"
        assert set(made[name]["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    # the routes have a CA of their own: no client certificate opens a route
    assert made["kinference-nats-tls"]["data"]["ca.crt"] != made["kinference-nats-routes-tls"]["data"]["ca.crt"]
    auth = made["kinference-nats-auth"]["stringData"]
    # every key a pod reads is there, and the passwords differ
    wanted = set()
    for kind in ("Deployment", "StatefulSet"):
        for d in of_kind(build(K8S), kind).values():
            spec = d["spec"]["template"]["spec"]
            for v in spec.get("volumes", []):
                if v.get("secret", {}).get("secretName") == "kinference-nats-auth":
                    wanted |= {i["key"] for i in v["secret"]["items"]}
            for e in container(d).get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] == "kinference-nats-auth":
                    wanted.add(ref["key"])
    assert wanted == set(auth)
    assert len(set(auth.values())) == len(auth)
    assert all(re.fullmatch(r"k[0-9a-f]{48}", pw) for pw in auth.values())
