"""Shipping: the Python client example, the offline bento build served by tag, and the
deployment manifests checked against the code (ports, probe paths, environment variables)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import bentoml
import pytest
import yaml

from fastinfer import photos
from tests.servers import ROOT, start_server, stop_server

BENTOML = Path(sys.executable).parent / "bentoml"
MANIFESTS = [ROOT / "compose.yaml", *sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))]


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
    """`bentoml build` (what `make bento` runs) into a fresh BENTOML_HOME over the test models."""
    home = tmp_path_factory.mktemp("bento-home")
    (home / "models").symlink_to(bentoml_home / "models")
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
    for path in ("src/service.py", "src/runners/base.py", "src/fastinfer/backends.py", "src/dashboard/index.html"):
        assert (root / path).is_file(), path
    assert not (root / "src" / "tests").exists()
    dockerfile = (root / "env" / "docker" / "Dockerfile").read_text()
    assert dockerfile.startswith("\n# ====") or "FROM python:3.11" in dockerfile
    assert "FROM python:3.11" in dockerfile
    manifest = yaml.safe_load((root / "bento.yaml").read_text())
    models = {m["tag"].split(":")[0] for svc in manifest["services"] for m in svc["models"]}
    from fastinfer.backends import SPECS

    here = {n for s in SPECS.values() if s.platform() is None for n in s.model_names()}
    assert {"resnet50-openvino", "resnet50-openvino-int8"} <= here  # OpenVINO runs on this machine
    assert here <= models, f"the bento lacks {here - models}"
    requirements = (root / "env" / "python" / "requirements.txt").read_text()
    assert "bentoml==1.4.40" in requirements and "torch==2.14.1" in requirements
    assert "openvino==2026.4.1" in requirements  # the container runs the OpenVINO backends too


def test_the_built_bento_serves_by_tag(bento, redis_server, tmp_path) -> None:
    home, tag = bento
    srv = start_server(home, tmp_path / "serve.log", {"REDIS_URL": redis_server.url}, target=tag, cwd=tmp_path)
    try:
        photo = tmp_path / "moto.jpg"
        photo.write_bytes(photos.benchmark_photo())
        with bentoml.SyncHTTPClient(srv.url, timeout=120) as client:
            for backend in ("onnx-int8", "openvino-int8"):
                result = client.classify(image=photo, backend=backend, top_k=3)
                assert result["backend"] == backend and len(result["top_k"]) == 3
    finally:
        stop_server(srv)


def documents() -> list[dict]:
    """The Kubernetes objects in the manifests."""
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc and "kind" in doc]


def config_env_names() -> set[str]:
    """Every environment variable name fastinfer/config.py reads (per-backend names expanded)."""
    from fastinfer.config import BACKENDS

    text = (ROOT / "fastinfer" / "config.py").read_text()
    names = set(re.findall(r'"((?:FASTINFER|GROQ)_[A-Z_]+|REDIS_URL)"', text))
    for prefix in ("FASTINFER_BATCHING_", "FASTINFER_MAX_BATCH_SIZE_", "FASTINFER_MAX_LATENCY_MS_"):
        names |= {prefix + b.upper().replace("-", "_") for b in BACKENDS}
    return names


def test_manifests_agree_with_the_code(client) -> None:
    docs = documents()
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
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fastinfer"]
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
