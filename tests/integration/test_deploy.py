"""Shipping: the Python client example, the offline bento build served by tag, and the
deployment manifests checked against the code (ports, probe paths, environment variables, secrets)
and against their schemas: Kubernetes' (kubernetes-validate) and the Compose spec's
(check-jsonschema's copy), both shipped in the wheels and read offline."""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import bentoml
import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

from fastinfer import __version__
from fastinfer.measure import photos
from load_tests.service import ROOT, free_port
from tests.servers import home_over, serve, serving, wait_for_port
from tests.spec_checks import spec_problems

BENTOML = Path(sys.executable).parent / "bentoml"
K8S_MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
# The oldest and the newest Kubernetes whose schemas kubernetes-validate==1.37.0 ships: a field that is
# new (or gone) in the versions between fails one of them.
K8S_VERSIONS = ("1.25.0", "1.37.0")
SECRET = "fastinfer"  # the Kubernetes Secret the Deployment reads: its keys, by the variable they set
SECRET_KEYS = {
    "FASTINFER_API_KEYS": "api-keys",
    "GROQ_API_KEY": "groq-api-key",
    "FASTINFER_REDIS_PASSWORD": "redis-password",
    "FASTINFER_CACHE_HMAC_KEY": "cache-hmac-key",
}


def test_client_example_against_a_live_server(server, tmp_path) -> None:
    photo, text = tmp_path / "cat.jpg", tmp_path / "notes.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    text.write_bytes(b"not a photo")
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client.py"), str(photo), str(text), "--url", server.url],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "classify:" in out.stdout and "compare:" in out.stdout and "fastest:" in out.stdout
    batch = [line for line in out.stdout.splitlines() if line.startswith("batch:")]
    assert len(batch) == 2 and "cat.jpg" in batch[0] and "not an image" in batch[1], out.stdout


@pytest.fixture(scope="module")
def bento(bentoml_home, tmp_path_factory, built_models) -> tuple[Path, str]:
    """`bentoml build` (what `make bento` runs, but untuned: its graph lacks the default backend's runner) into a
    fresh BENTOML_HOME over the test models."""
    home = home_over(tmp_path_factory.mktemp("bento") / "home", bentoml_home)
    env = {"BENTOML_HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    build = subprocess.run([str(BENTOML), "build", "."], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    listed = subprocess.run([str(BENTOML), "list", "-o", "json"], env=env, capture_output=True, text=True, check=True)
    (entry,) = json.loads(listed.stdout)
    return home, entry["tag"]


def test_bento_holds_code_dashboard_models_and_a_dockerfile(bento) -> None:
    home, tag = bento
    name, version = tag.split(":")
    root = home / "bentos" / name / version
    for path in (
        "src/service.py",
        "src/runners/base.py",
        "src/fastinfer/catalog/backends.py",
        "src/dashboard/index.html",
    ):
        assert (root / path).is_file(), path
    assert not (root / "src" / "tests").exists()
    dockerfile = (root / "env" / "docker" / "Dockerfile").read_text()
    assert dockerfile.startswith("\n# ====") or "FROM python:3.11" in dockerfile
    assert "FROM python:3.11" in dockerfile
    manifest = yaml.safe_load((root / "bento.yaml").read_text())
    models = {m["tag"].split(":")[0] for svc in manifest["services"] for m in svc["models"]}
    from fastinfer.catalog.backends import SPECS

    here = {n for s in SPECS.values() if s.platform() is None for n in s.model_names()}
    assert {"resnet50-openvino", "resnet50-openvino-int8"} <= here  # OpenVINO runs on this machine
    assert here <= models, f"the bento lacks {here - models}"
    requirements = (root / "env" / "python" / "requirements.txt").read_text()
    assert "bentoml==1.4.40" in requirements and "torch==2.14.1" in requirements
    assert "openvino==2026.4.1" in requirements  # the container runs the OpenVINO backends too
    # Its README is the API page's text (bentofile.yaml description), not BentoML's placeholder.
    assert (root / "README.md").read_text() == (ROOT / "fastinfer" / "front" / "api_page.md").read_text()
    for name in ("api_page.md", "api_page.html", "api_spec.json"):  # what the served page and spec read
        assert (root / "src" / "fastinfer" / "front" / name).is_file(), name
    built = yaml.safe_load((root / "apis" / "openapi.yaml").read_text())
    assert spec_problems(built) == []
    assert "## This server" not in built["info"]["description"]  # built here, served elsewhere


BENTO_SERVES = ("onnx-int8", "openvino-int8")  # an ONNX Runtime and an OpenVINO backend: both runtimes packed


def test_the_built_bento_serves_by_tag(bento, redis_server, tmp_path) -> None:
    home, tag = bento
    env = {"REDIS_URL": redis_server.url, **serving(*BENTO_SERVES)}
    with serve(tmp_path, env, home=home, target=tag, cwd=tmp_path) as srv:
        photo = tmp_path / "moto.jpg"
        photo.write_bytes(photos.benchmark_photo())
        with bentoml.SyncHTTPClient(srv.url, timeout=120) as client:
            for backend in BENTO_SERVES:
                result = client.classify(image=photo, backend=backend, top_k=3)
                assert result["backend"] == backend and len(result["top_k"]) == 3
        spec = httpx.get(f"{srv.url}/docs.json", timeout=30).json()
        assert spec_problems(spec) == [] and spec["info"]["version"] == f"{__version__} (bento {tag})"
        # Built untuned, the bento's graph lacks its default backend's runner: served with every engine asked in
        # its runner (FASTINFER_IN_FRONT=none), that engine is held by the front worker instead of a failed start.
        name, version = tag.split(":")
        built = {
            s["name"] for s in yaml.safe_load((home / "bentos" / name / version / "bento.yaml").read_text())["services"]
        }
        rows = {b["name"]: b for b in httpx.get(f"{srv.url}/backends", timeout=30).json()["backends"]}
        for backend in BENTO_SERVES:
            placed = rows[backend]["runs_on"]["placement"]
            assert placed == ("runner process" if f"runner-{backend}" in built else "front worker"), (backend, built)


def config_env_names() -> set[str]:
    """Every environment variable name the settings read (fastinfer/catalog/config.py's fields, the tuned file's,
    and backends.py's OpenVINO precision), per-backend names expanded."""
    from fastinfer.catalog.config import BACKENDS, BatchingConfig, GroqConfig, Settings, variables

    fields = [(n, f) for cls in (Settings, GroqConfig, BatchingConfig) for n, f in cls.model_fields.items()]
    names = {v for name, field in fields if field.description for v in variables(name, field)}
    names |= {"FASTINFER_TUNED", "FASTINFER_OPENVINO_PRECISION"}
    for template in [name for name in names if name.endswith("<BACKEND>")]:
        names.remove(template)
        names |= {template.replace("<BACKEND>", b.upper().replace("-", "_")) for b in BACKENDS}
    return names


def test_manifests_agree_with_the_code(client) -> None:
    docs = [doc for _, doc in k8s_documents()]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    known = config_env_names()
    assert {"FASTINFER_CACHE", "REDIS_URL", "GROQ_API_KEY", "FASTINFER_MAX_CONCURRENCY"} <= known

    # Compose: port 3000 (bentoml serve's default, README's), cache pointed at the redis service.
    app = compose["services"]["fastinfer"]
    assert app["ports"] == ["3000:3000"]
    assert set(app["environment"]) <= known
    assert app["environment"]["REDIS_URL"].startswith("redis://redis:")
    assert "/readyz" in " ".join(app["healthcheck"]["test"])

    # Kubernetes: probes on real routes, the container port, env names the code reads.
    deployment = k8s_object("Deployment", "fastinfer")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"][0]["containerPort"] == 3000
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/livez"}
    for path in probes:
        assert client.get(path).status_code == 200, path
    assert {e["name"] for e in container["env"]} <= known
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    redis_url = next(e["value"] for e in container["env"] if e["name"] == "REDIS_URL")
    redis_services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert redis_url.split("//")[1].split(":")[0] in redis_services
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "fastinfer"
    # Shutdown: the grace periods outlast what may be in flight (a request may take FASTINFER_TIMEOUT_S).
    timeout_s = int(next(e["value"] for e in container["env"] if e["name"] == "FASTINFER_TIMEOUT_S"))
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > pre_stop_s + timeout_s
    assert int(app["stop_grace_period"].removesuffix("s")) > int(app["environment"]["FASTINFER_TIMEOUT_S"])
    # The /analyze guard counts per pod: at most replicas, the deploy stays within the default total.
    from fastinfer.catalog.config import Settings

    per_pod = int(next(e["value"] for e in container["env"] if e["name"] == "FASTINFER_ANALYZE_TOTAL_PER_MINUTE"))
    assert per_pod * hpa["spec"]["maxReplicas"] <= Settings.model_fields["analyze_total_per_minute"].default


def k8s_documents() -> list[tuple[str, dict]]:
    """Every document in deploy/k8s/*.yaml, named ``file:kind/name``."""
    return [
        (f"{path.name}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc)
        for path in K8S_MANIFESTS
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def k8s_object(kind: str, name: str) -> dict:
    (found,) = [d for _, d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def validate_k8s(doc: dict, version: str) -> None:
    """Raises unless ``doc`` is a valid object of Kubernetes ``version``. Strict: an unknown field
    (a typo) is an error, not ignored; a kind or apiVersion without a schema there is an error too."""
    validated = kubernetes_validate.validate(doc, version, strict=True)
    assert validated == ".".join(version.split(".")[:2]), f"checked against {validated}, not {version}"


def validate_compose(doc: dict) -> None:
    """Raises unless ``doc`` follows the Compose spec's JSON schema (unknown keys are errors there)."""
    schema = json.loads(
        importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


@pytest.fixture
def offline(monkeypatch):
    """No network in this test: the schemas must come from the installed packages."""

    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), k8s_documents(), ids=[name for name, _ in k8s_documents()])
def test_k8s_manifests_follow_the_kubernetes_schemas(offline, name, doc, version) -> None:
    validate_k8s(doc, version)


# A manifest broken on purpose (one edit to the real text) is refused by the same check.
K8S_BREAKAGES = {
    "typo'd field": ("containerPort: 3000", "containerPorts: 3000", "'containerPort' is a required property"),
    "unknown field": (
        "terminationGracePeriodSeconds: 45",
        "terminationGracePeriodSecond: 45",
        "'terminationGracePeriodSecond' was unexpected",
    ),
    "wrong type": ("replicas: 2", 'replicas: "2"', "'2' is not of type 'integer'"),
    "wrong type in the secret reference": ("optional: true}", 'optional: "true"}', "'true' is not of type 'boolean'"),
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("old", "new", "error"), K8S_BREAKAGES.values(), ids=K8S_BREAKAGES)
def test_k8s_validation_refuses_a_broken_manifest(offline, old, new, error, version) -> None:
    text = (ROOT / "deploy" / "k8s" / "fastinfer.yaml").read_text()
    assert old in text, f"the manifest no longer has {old!r}: pick another edit"
    broken = [doc for doc in yaml.safe_load_all(text.replace(old, new)) if doc]
    (deployment,) = [doc for doc in broken if doc["kind"] == "Deployment"]
    with pytest.raises(kubernetes_validate.ValidationError, match=re.escape(error)):
        validate_k8s(deployment, version)


def test_k8s_validation_is_strict(offline) -> None:
    """Without strict, the schemas let an unknown field through: strict is what catches typos."""
    text = (ROOT / "deploy" / "k8s" / "fastinfer.yaml").read_text()
    old, new, _ = K8S_BREAKAGES["unknown field"]
    (deployment,) = [d for d in yaml.safe_load_all(text.replace(old, new)) if d and d["kind"] == "Deployment"]
    kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=False)  # passes (strict: K8S_BREAKAGES)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # a misspelt kind is no pass either
        validate_k8s({**deployment, "kind": "Deploymnet"}, K8S_VERSIONS[-1])


def test_compose_follows_the_compose_spec(offline) -> None:
    validate_compose(yaml.safe_load((ROOT / "compose.yaml").read_text()))
    text = (ROOT / "compose.yaml").read_text()
    for old, new in (("stop_grace_period:", "stop_grace_periods:"), ("retries: 30", "retries: [30]")):
        assert old in text
        with pytest.raises(jsonschema.ValidationError):
            validate_compose(yaml.safe_load(text.replace(old, new)))


def test_readiness_checks_wait_longer_than_the_front_takes_to_answer() -> None:
    """/readyz answers within READY_TIMEOUT_S, naming a runner that does not answer: a check that gives up
    sooner (Kubernetes' default timeoutSeconds is 1) loses that reason and counts a timeout instead."""
    from fastinfer.front.http import READY_TIMEOUT_S

    check = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["fastinfer"]["healthcheck"]
    assert int(check["timeout"].removesuffix("s")) > READY_TIMEOUT_S
    assert float(re.search(r"timeout=([0-9.]+)", " ".join(check["test"])).group(1)) > READY_TIMEOUT_S
    (container,) = k8s_object("Deployment", "fastinfer")["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"].get("timeoutSeconds", 1) > READY_TIMEOUT_S


def test_k8s_takes_the_keys_from_a_secret() -> None:
    kinds = [doc["kind"] for _, doc in k8s_documents()]
    assert "Secret" not in kinds, "no Secret in the manifests: a committed one gets applied"
    (container,) = k8s_object("Deployment", "fastinfer")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    for name, key in SECRET_KEYS.items():
        assert "value" not in env[name], f"{name} is a plain value"
        # optional: pods start without the Secret, with keys off and no Groq (as compose does with no files).
        assert env[name]["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": key, "optional": True}}
    refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert {ref["name"] for ref in refs} == {SECRET}
    # The command the manifest's comment and the deploy docs give creates that Secret with those keys.
    for text in ((ROOT / "deploy" / "k8s" / "fastinfer.yaml").read_text(), (ROOT / "docs" / "deploy.md").read_text()):
        assert f"kubectl create secret generic {SECRET}" in text
        assert all(f"--from-literal={key}=" in text for key in SECRET_KEYS.values())


def test_compose_takes_the_keys_from_secret_files() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    app = compose["services"]["fastinfer"]
    env, declared = app["environment"], compose["secrets"]
    assert not set(SECRET_KEYS) & set(env), "the keys come from secret files, not plain values"
    mounted = {}  # secret name -> where it is in the container
    for entry in app["secrets"]:
        source = entry if isinstance(entry, str) else entry["source"]
        target = "" if isinstance(entry, str) else entry.get("target", "")
        mounted[source] = target if target.startswith("/") else f"/run/secrets/{target or source}"
    assert set(mounted) <= set(declared), f"undeclared secrets: {set(mounted) - set(declared)}"
    # Each *_FILE points at its mounted secret only when the host variable of the same name is set
    # (${VAR:+path}): unset, the service sees it empty (= unset), keys off and no Groq, instead of an
    # empty secret file, which it refuses.
    files = {}
    for name, value in env.items():
        if name.endswith("_FILE"):
            alternative = re.fullmatch(r"\$\{(\w+):\+(/run/secrets/\w+)\}", value)
            assert alternative and alternative[1] == name, f"{name}: ${{{name}:+/run/secrets/...}}"
            files[name] = alternative[2]
    assert set(files) == {f"{name}_FILE" for name in SECRET_KEYS}
    for name, path in files.items():
        assert path in mounted.values(), f"{name}={path} is no mounted secret"
    # `docker compose up` with nothing set starts: a missing `file:` stops it, and so does an
    # `environment:` source whose variable is unset. So each source is a file whose default exists.
    for name, secret in declared.items():
        assert set(secret) == {"file"}, f"secret {name}: a file, with a default that exists"
        default = re.fullmatch(r"\$\{(\w+):-([^}]+)\}", secret["file"])
        assert default, f"secret {name}: file: ${{VARIABLE:-default}}"
        placeholder = ROOT / default[2]  # relative to compose.yaml's folder, in the repository
        assert placeholder.is_file() and not placeholder.read_bytes(), f"{default[2]}: an empty file in the repo"
        if name in mounted:  # the host's variable is the setting the service reads the mounted file by
            assert files.get(default[1]) == mounted[name], f"secret {name} is set by {default[1]}"


# --- the shared Redis: a password from the Secret, reached by FastInfer's pods only ---------------


def test_k8s_redis_requires_the_password_fastinfer_is_given() -> None:
    (redis_container,) = k8s_object("Deployment", "fastinfer-redis")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in redis_container["env"]}
    # Required (no `optional`): without the password this Redis does not start, rather than start open.
    assert env["REDISCLI_AUTH"]["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": "redis-password"}}
    args = redis_container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"  # put in by Kubernetes, not a value
    # FastInfer's pods are given the same key: test_k8s_takes_the_keys_from_a_secret.


def test_k8s_redis_admits_only_fastinfer_pods() -> None:
    redis_deployment, app = k8s_object("Deployment", "fastinfer-redis"), k8s_object("Deployment", "fastinfer")
    policy = k8s_object("NetworkPolicy", "fastinfer-redis")["spec"]
    redis_labels = redis_deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}, "pods only: no namespaceSelector or ipBlock"
    assert source["podSelector"]["matchLabels"].items() <= app["spec"]["template"]["metadata"]["labels"].items()
    (redis_container,) = redis_deployment["spec"]["template"]["spec"]["containers"]
    assert rule["ports"] == [{"protocol": "TCP", "port": redis_container["ports"][0]["containerPort"]}]


@pytest.fixture
def tools(tmp_path) -> dict[str, str]:
    """PATH where `redis-cli` talks to a test port, and the redis image's docker-entrypoint.sh runs
    redis-server on it: the manifests' own commands run here against a real redis-server."""
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.fail("redis-server and redis-cli are not installed (apt-get install redis-server; make test does)")
    port = free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "redis-cli").write_text(f'#!/bin/sh\nexec {shutil.which("redis-cli")} -p {port} "$@"\n')
    (bin_dir / "docker-entrypoint.sh").write_text(
        f'#!/bin/sh\nexec "$@" --port {port} --bind 127.0.0.1 --dir {tmp_path}\n'  # the image's drops privileges
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PORT": str(port)}


def answers_without_password(port: int) -> bool:
    import redis

    # No retries: redis-py's default retries a refused HELLO with backoff, ~4 s of waiting for the same answer.
    with redis.Redis(port=port, retry=None) as r:
        try:
            return r.ping()
        except redis.exceptions.AuthenticationError:
            return False


def test_k8s_redis_as_kubernetes_starts_it(tools, tmp_path) -> None:
    """The container's args, with $(REDISCLI_AUTH) put in as the kubelet does, run a Redis that
    requires the password, and the readiness probe (with the same variable) passes only with it."""
    (container,) = k8s_object("Deployment", "fastinfer-redis")["spec"]["template"]["spec"]["containers"]
    password = "k8s-redis-pw-0123456789"
    args = [a.replace("$(REDISCLI_AUTH)", password) for a in container["args"]]
    port = int(tools["PORT"])
    process = subprocess.Popen(
        [shutil.which("redis-server"), *args, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process)
        assert not answers_without_password(port)
        probe = container["readinessProbe"]["exec"]["command"]
        run = lambda env: subprocess.run(probe, env={**tools, **env}, timeout=10, check=False).returncode  # noqa: E731
        assert run({"REDISCLI_AUTH": password}) == 0
        assert run({}) != 0 and run({"REDISCLI_AUTH": "wrong"}) != 0
        assert password not in Path(f"/proc/{process.pid}/cmdline").read_text()  # Redis rewrote its title
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("with_password", [True, False], ids=["password", "none"])
def test_compose_redis_as_compose_starts_it(tools, tmp_path, with_password: bool) -> None:
    """The redis service's command and health check, with Compose's `$$` as `$`, against a real
    redis-server: with the secret file it requires that password, with the empty placeholder none."""
    service = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["redis"]
    password = "compose-redis-pw-0123456789"
    secret = tmp_path / "secret"
    secret.write_text(password + "\n" if with_password else "")
    env = {**tools, "REDIS_PASSWORD_FILE": str(secret)}
    assert service["environment"]["REDIS_PASSWORD_FILE"].startswith("/run/secrets/")
    command = [part.replace("$$", "$") for part in service["command"]]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    port = int(tools["PORT"])
    try:
        wait_for_port(port, process)
        assert answers_without_password(port) is not with_password
        kind, check = service["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        health = subprocess.run(["sh", "-c", check.replace("$$", "$")], env=env, timeout=10, check=False)
        assert health.returncode == 0
        if with_password:
            assert password not in Path(f"/proc/{process.pid}/cmdline").read_text()
            secret.write_text("wrong")  # the check authenticates with what the file holds
            wrong = subprocess.run(["sh", "-c", check.replace("$$", "$")], env=env, timeout=10, check=False)
            assert wrong.returncode != 0
    finally:
        process.kill()
        process.wait()
