"""Each assumption fastinfer/compat/bentoml.py makes about BentoML (its docstring numbers them), checked
against the installed BentoML: an upgrade that breaks one fails here, naming it."""

from __future__ import annotations

import ast
import copy
import inspect
import json
import logging
import textwrap
from pathlib import Path
from types import SimpleNamespace

import bentoml
import pytest
from _bentoml_impl.server import app as server_app
from _bentoml_impl.server import serving as bentoml_serving
from _bentoml_impl.worker import service as worker
from bentoml.serving import ensure_prometheus_dir
from pydantic import BaseModel

from fastinfer.common.schemas import BatchResponse
from fastinfer.compat import bentoml as compat


def test_1_the_spec_is_built_of_bentomls_own_classes_and_tags() -> None:
    @bentoml.service
    class Probe:
        @bentoml.api
        def echo(self, x: int) -> int:
            return x

    spec = Probe.openapi_spec
    assert isinstance(spec, compat.OpenAPISpecification), (
        "assumption 1: BentoML's generated spec is an OpenAPISpecification (bentoml._internal.service.openapi)"
    )
    assert compat.APP_TAG in spec.tags and compat.INFRA_TAG in spec.tags, (
        "assumption 1: the generated spec's tags are APP_TAG (the APIs) and INFRA_TAG (the probes)"
    )
    assert all(isinstance(item, compat.PathItem) for item in spec.paths.values()), (
        "assumption 1: the spec's paths are PathItem objects"
    )
    assert isinstance(spec.info.contact, compat.Contact), "assumption 1: the spec's info.contact is a Contact"
    doc = json.loads(json.dumps(spec.asdict()))
    doc["components"]["securitySchemes"] = {"key": {"type": "http", "scheme": "bearer"}}  # no field of BentoML's
    rebuilt = compat.openapi_spec(doc)
    assert isinstance(rebuilt, compat.OpenAPISpecification)
    assert all(isinstance(item, compat.PathItem) for item in rebuilt.paths.values())
    assert json.loads(json.dumps(rebuilt.asdict())) == doc, (
        "assumption 1: bentoml_cattr.structure makes the spec object from its JSON form, and back"
    )


def _service_type_set(branch: list[ast.stmt]) -> str | None:
    """The value a branch of the worker's main() gives ``server_context.service_type``, if it gives one."""
    for node in (n for statement in branch for n in ast.walk(statement)):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["server_context.service_type"]:
            return ast.literal_eval(node.value)
    return None


def test_2_only_a_dependency_worker_has_service_type_service() -> None:
    from bentoml._internal.context import server_context

    assert compat.server_context is server_context, (
        "assumption 2: bentoml.server_context is the object BentoML's worker sets (bentoml._internal.context)"
    )
    tree = ast.parse(textwrap.dedent(inspect.getsource(worker.main.callback)))
    branches = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _service_type_set(node.body) and _service_type_set(node.orelse)
    ]
    assert len(branches) == 1, "assumption 2: BentoML's worker sets server_context.service_type in one if/else"
    branch = branches[0]
    test, body = ast.unparse(branch.test), ast.unparse(branch.body)
    assert (_service_type_set(branch.body), _service_type_set(branch.orelse)) == ("service", "entry_service") and (
        test == "service_name and service_name != service.name"
        and "service.find_dependent_by_name(service_name)" in body
    ), (
        'assumption 2: BentoML\'s worker sets server_context.service_type to "service" when its --service-name '
        'names a dependency of the loaded service, and to "entry_service" otherwise'
    )
    service_type = server_context.service_type
    try:
        for value, expected in (("service", True), ("entry_service", False), (None, False)):
            server_context.service_type = value
            assert compat.in_dependency() is expected
    finally:
        server_context.service_type = service_type


def test_3_a_failed_api_call_is_logged_to_api_error_logger(caplog: pytest.LogCaptureFixture) -> None:
    request = SimpleNamespace(url=SimpleNamespace(path="/analyze"), method="POST")
    with caplog.at_level(logging.ERROR, logger=compat.API_ERROR_LOGGER):
        server_app.log_exception(request, exc_info=None)  # what BentoML's app calls when an API fails
    assert [r.name for r in caplog.records] == [compat.API_ERROR_LOGGER], (
        f"assumption 3: BentoML logs a failed API call to the logger {compat.API_ERROR_LOGGER!r}"
    )


def test_4_bentoml_serve_takes_the_prometheus_directory_from_the_container(tmp_path: Path) -> None:
    from bentoml._internal.configuration.containers import BentoMLContainer

    before = BentoMLContainer.prometheus_multiproc_dir.get()
    try:
        compat.set_prometheus_dir(str(tmp_path / "metrics"))
        assert ensure_prometheus_dir() == str(tmp_path / "metrics"), (
            "assumption 4: bentoml serve's ensure_prometheus_dir reads BentoMLContainer.prometheus_multiproc_dir"
        )
    finally:
        BentoMLContainer.prometheus_multiproc_dir.set(before)
    assert "ensure_prometheus_dir()" in inspect.getsource(bentoml_serving), (
        "assumption 4: bentoml serve (_bentoml_impl/server/serving.py) calls ensure_prometheus_dir"
    )


def test_5_the_configuration_is_a_dict_with_tracing_on_top_and_under_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bentoml._internal.configuration.containers import BentoMLContainer

    config = compat.configuration()
    assert isinstance(config, dict) and {"sample_rate", "exporter_type"} <= set(config["tracing"]), (
        "assumption 5: BentoMLContainer.config holds a dict with tracing.sample_rate and tracing.exporter_type"
    )

    @bentoml.service
    class Dependency:
        @bentoml.api
        def echo(self, x: int) -> int:
            return x

    @bentoml.service
    class Entry:
        dependency = bentoml.depends(Dependency)

    # An operator's tracing for one dependency, as bentoml serve loads it (the service configuration, version 2).
    options = {"services": {"Dependency": {"tracing": {"sample_rate": 0.25, "exporter_type": "zipkin"}}}}
    monkeypatch.setenv("BENTOML_CONFIG_OVERRIDES", json.dumps(options))
    before = copy.deepcopy(BentoMLContainer.config.get())
    try:
        Entry.inject_config()
        tracing = compat.configuration().get("services", {}).get("Dependency", {}).get("tracing", {})
    finally:
        BentoMLContainer.config.set(before)
    assert (tracing.get("sample_rate"), tracing.get("exporter_type")) == (0.25, "zipkin"), (
        "assumption 5: tracing an operator sets for one service is in BentoMLContainer.config under "
        "services.<name>.tracing (sample_rate, exporter_type)"
    )


def test_6_a_worker_runs_the_worker_module_with_service_name_and_fd() -> None:
    assert bentoml_serving._SERVICE_WORKER_SCRIPT.startswith(compat.WORKER_MODULE), (
        f"assumption 6: bentoml serve runs each worker as python -m {compat.WORKER_MODULE}..."
    )
    options = {opt for param in worker.main.params for opt in param.opts}
    assert {"--service-name", "--fd"} <= options, "assumption 6: the worker takes --service-name and --fd"
    tree = ast.parse(textwrap.dedent(inspect.getsource(bentoml_serving.create_dependency_watcher)))
    lists = [[ast.unparse(item) for item in node.elts] for node in ast.walk(tree) if isinstance(node, ast.List)]
    wanted = ["'--service-name'", "svc.name", "'--fd'"]  # as ast.unparse writes them, however they are formatted
    assert any(words[i : i + 3] == wanted for words in lists for i in range(len(words))), (
        "assumption 6: each dependency's worker is given --service-name <its name> and --fd <its socket>"
    )
    line = ["python", "-m", bentoml_serving._SERVICE_WORKER_SCRIPT, ".", "--service-name", "runner-x", "--fd", "7"]
    assert (compat.worker_service(line), compat.socket_fd(line)) == ("runner-x", 7)
    assert compat.worker_service(["bentoml", "serve", "--service-name", "x"]) is None


def test_7_typed_inputs_are_parsed_by_from_http_request() -> None:
    method = inspect.getattr_static(bentoml.IODescriptor, "from_http_request")
    assert isinstance(method, classmethod), "assumption 7: IODescriptor.from_http_request is a classmethod"
    assert list(inspect.signature(bentoml.IODescriptor.from_http_request).parameters) == ["request", "serde"], (
        "assumption 7: IODescriptor.from_http_request takes (request, serde)"
    )
    assert ".input_spec.from_http_request(request, serde)" in inspect.getsource(server_app), (
        "assumption 7: BentoML's app parses an API's input with input_spec.from_http_request(request, serde)"
    )


def test_8_service_dependencies_name_each_depended_on_service() -> None:
    @bentoml.service
    class Runner:
        pass

    @bentoml.service
    class Front:
        runner = bentoml.depends(Runner)

    assert Front.dependencies["runner"].on is Runner, (
        "assumption 8: Service.dependencies maps each bentoml.depends attribute to it, .on the service"
    )


class A(BaseModel):
    a: int


class B(BaseModel):
    b: int


class AnyOf(BaseModel):  # test 9's
    items: list[A | B]


def test_9_the_python_client_reads_one_of_as_sent_and_any_of_as_its_first_choice() -> None:
    from _bentoml_impl.serde import JSONSerde, Payload  # how SyncHTTPClient decodes an answer, by /schema.json

    @bentoml.service(name="probe-9")
    class Probe:
        @bentoml.api
        async def any_of(self) -> AnyOf:
            raise NotImplementedError

        @bentoml.api
        async def batch(self) -> BatchResponse:
            raise NotImplementedError

    outputs = {route["name"]: route["output"] for route in Probe.schema()["routes"]}  # what /schema.json serves

    def received(api: str, answer: BaseModel) -> object:
        return JSONSerde().deserialize(Payload((answer.model_dump_json().encode(),), {}), outputs[api])

    sent = AnyOf.model_validate({"items": [{"a": 1}, {"b": 2}]})
    assert received("any_of", sent) == {"items": [{"a": 1}, {}]}, "assumption 9: an anyOf is read as its first choice"
    batch = BatchResponse.model_validate({"results": [{"error": {"code": "invalid_image", "message": "x"}}]})
    assert received("batch", batch) == batch.model_dump(mode="json"), (
        "assumption 9: a oneOf item (BatchResponse's) is handed through as sent"
    )


def test_10_a_bento_is_loaded_by_the_services_its_bento_yaml_names(tmp_path: Path) -> None:
    """A served graph with a service the bento was built without stops the start (the bento's layout itself, code
    in ``src/`` beside ``bento.yaml``, is checked on a real build: tests/integration/test_deploy.py)."""
    from _bentoml_sdk.service.factory import Service

    source = inspect.getsource(Service.on_load_bento)
    assert "next(" in source and "bento.info.services" in source and "info.name == svc.name" in source
    (tmp_path / "src").mkdir()
    (tmp_path / "bento.yaml").write_text("services:\n- name: fastinfer\n- name: runner-onnx\n")
    code = str(tmp_path / "src" / "service.py")
    assert compat.bento_services(code, "fastinfer") == {"fastinfer", "runner-onnx"}
    assert compat.bento_services(code, "another-app") is None  # a bento.yaml there, but not of this service
    assert compat.bento_services(str(tmp_path / "elsewhere" / "src" / "service.py"), "fastinfer") is None
    assert compat.bento_services(str(tmp_path / "checkout" / "service.py"), "fastinfer") is None  # not in src/
    assert compat.bento_services(None, "fastinfer") is None  # a module without a file (python -c)
    for broken in ("services: [", "services: 3", "services:\n- id: x\n", "", "text", "services: [é]".encode("latin-1"),
                   "services: " + "[" * 20000):  # fmt: skip
        (tmp_path / "bento.yaml").write_bytes(broken if isinstance(broken, bytes) else broken.encode())
        with pytest.raises(SystemExit, match=r"fastinfer: .*bento.yaml is not a bento.yaml BentoML wrote"):
            compat.bento_services(code, "fastinfer")


def test_11_models_are_read_from_the_model_stores_folder(tmp_path: Path) -> None:
    """BentoML's store, not $BENTOML_HOME/models: served from a bento in a container, it is the bento's own,
    and store.get (its cache keyed on the folder) answers as bentoml.models.get does."""
    import bentoml
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models.model import ModelStore

    from fastinfer.catalog import store
    from tests.conftest import model_store_at

    home, bento = tmp_path / "home", tmp_path / "bento-models"
    with model_store_at(home), bentoml.models.create("compat-check", labels={"in": "home"}):
        pass
    bento.mkdir()
    with model_store_at(home), BentoMLContainer.model_store.patch(ModelStore(bento)):
        with bentoml.models.create("compat-check", labels={"in": "bento"}) as made:
            pass
        folder = compat.model_store_dir() / "compat-check"
        assert compat.model_store_dir() == bento
        assert (folder / "latest").read_text().strip() == made.tag.version
        assert Path(bentoml.models.get("compat-check:latest").path) == folder / made.tag.version
        assert (folder / made.tag.version / "model.yaml").is_file()
        assert store.get("compat-check:latest").info.labels == {"in": "bento"}


def test_12_a_record_is_parsed_by_the_yaml_of_bentomls_model_module(tmp_path: Path, monkeypatch) -> None:
    """BentoML parses a record with that module's ``yaml.safe_load``; libyaml's stand-in reads 1,000 class names
    (quotes, commas, accents) and floats as PyYAML's own loader does."""
    import yaml
    from bentoml._internal.models import model

    from tests.conftest import model_store_at

    classes = [f"class {i}: a name, with 'quotes' and ünïcode" for i in range(1000)]
    with model_store_at(tmp_path / "home"):
        with bentoml.models.create("compat-yaml", metadata={"categories": classes, "mean": [0.485, 1e-7]}) as made:
            pass
        monkeypatch.setattr(model, "yaml", yaml)  # as BentoML imports it
        compat.read_records_with_libyaml()
        assert (model.yaml is not yaml) == yaml.__with_libyaml__
        read = bentoml.models.get(made.tag).info
        parsed: list[object] = []
        parse = model.yaml.safe_load  # PyYAML's own where it has no libyaml: the spy must not call itself
        monkeypatch.setattr(model.yaml, "safe_load", lambda stream: parsed.append(stream) or parse(stream))
        bentoml.models.get(made.tag)
    assert parsed, "BentoML no longer parses records with its model module's yaml.safe_load"
    assert read.metadata["categories"] == classes and read.metadata["mean"] == [0.485, 1e-7]
    assert read.metadata == yaml.safe_load((Path(made.path) / "model.yaml").read_text())["metadata"]
