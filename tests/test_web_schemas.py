"""The API's request bodies are declared once (web/schemas.py): the handlers validate
through the models and the OpenAPI document shows the models' schemas, so the two
cannot drift apart. Driven from the document itself: a new operation with a body is
covered without touching these tests."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from test_web_api import OPS, make_app

from web import refusals, schemas
from web.settings import WebSettings

#: Path parameters of the operations with a body: a family that exists, ids that do not
#: (a body is checked before anything is looked up).
PATH_VALUES = {"name": "noop", "page_id": "999", "channel_id": "999", "run_id": "999"}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    application = make_app(tmp_path)
    yield application
    application.extensions["jodl"].engine.dispose()


def _bodies(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, request body schema) of every operation that takes a body."""
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if "requestBody" in operation:
                content = operation["requestBody"]["content"]
                yield method, path, content["application/json"]["schema"]


def test_every_body_refuses_an_unknown_field(app: Flask) -> None:
    client = app.test_client()
    doc = client.get("/api/openapi.json").get_json()
    operations = list(_bodies(doc))
    assert len(operations) >= 20
    for method, path, _ in operations:
        url = re.sub(r"\{([a-z_]+)\}", lambda m: PATH_VALUES[m.group(1)], path)
        r = client.open(url, method=method.upper(), json={"surplus": 1}, headers=OPS)
        message = (r.get_json() or {}).get("message", "")
        assert r.status_code == 400, (method, path, r.status_code, message)
        # Refused for the unknown field, which the answer names with the fields there are.
        assert message.startswith("surplus: "), (method, path, message)
        assert "(fields: " in message, (method, path, message)


def test_each_body_in_the_document_is_exactly_its_models_schema(app: Flask) -> None:
    settings: WebSettings = app.extensions["jodl"].settings
    doc = app.test_client().get("/api/openapi.json").get_json()
    models = {model.__name__: model for model in schemas.models(settings)}
    components = doc["components"]["schemas"]
    used = set()
    for method, path, schema in _bodies(doc):
        model = models.get(schema.get("title"))
        assert model is not None, (method, path, "a body not declared in web/schemas.py")
        assert schema == schemas.body_schema(model), (method, path)
        assert schema["additionalProperties"] is False, (method, path)
        for name, nested in schemas.json_schema(model).get("$defs", {}).items():
            assert components[name] == nested, (method, path, name)
        used.add(model.__name__)
    assert used == set(models)  # no model the document leaves out


def test_query_parameters_in_the_document_are_their_models_fields(app: Flask) -> None:
    doc = app.test_client().get("/api/openapi.json").get_json()
    listed = {
        (method, path): [p for p in operation.get("parameters", []) if p["in"] == "query"]
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
    }
    for (method, path), model in {
        ("get", "/api/families/{name}/results"): schemas.ResultsQuery,
        ("get", "/api/admin/runs/{run_id}/jobs"): schemas.RunJobsQuery,
        ("get", "/api/admin/families/{name}/jobs"): schemas.FamilyJobsQuery,
        ("get", "/api/trackings/export"): schemas.ExportQuery,
    }.items():
        assert listed[(method, path)] == schemas.query_parameters(model), (method, path)
    client = app.test_client()
    r = client.get("/api/admin/runs/1/jobs?state=running", headers=OPS)
    assert r.status_code == 400 and r.get_json()["message"].startswith("state: one of 'done'")
    r = client.get("/api/families/noop/results?after=soon", headers=OPS)
    assert r.status_code == 400 and r.get_json()["message"] == "after: a whole number"
    # An empty value is one not given; a parameter the model does not name is ignored.
    r = client.get("/api/admin/families/noop/jobs?state=&limit=&_=1", headers=OPS)
    assert r.status_code == 404  # no family noop in this database: the query was taken


def test_the_document_follows_the_operators_limits(tmp_path: Path) -> None:
    app = make_app(tmp_path, web_batch_max=7, web_url_max=300)
    doc = app.test_client().get("/api/openapi.json").get_json()
    body = doc["paths"]["/api/batches"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["properties"]["urls"]["maxItems"] == 7
    body = doc["paths"]["/api/pages"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["properties"]["url"]["maxLength"] == 300
    client = app.test_client()
    r = client.post("/api/batches", json={"urls": [f"http://a.example/{i}" for i in range(8)]})
    assert r.status_code == 400 and r.get_json()["message"] == "urls: at most 7 items"
    app.extensions["jodl"].engine.dispose()


def refused(model: type[schemas.Body], data: Any) -> str:
    with pytest.raises(Exception) as caught:
        refusals.validated(model, data)
    return str(caught.value.description)  # type: ignore[attr-defined]


def test_a_refusal_is_one_line_naming_the_field() -> None:
    jobs = schemas.Jobs
    assert refused(jobs, {"jobs": [{"key": "a"}, {"key": ""}]}) == "jobs[1].key: not empty"
    assert refused(jobs, {"jobs": [{"key": "a", "payload": [1]}]}) == (
        "jobs[0].payload: a JSON object"
    )
    assert refused(jobs, {"jobs": [{"key": "a", "x": 1}]}) == (
        "jobs[0].x: not a field of this request (fields: key, payload)"
    )
    assert refused(jobs, {"jobs": []}) == "jobs: a non-empty list"
    # An unknown field is named first, whatever else is wrong.
    assert refused(jobs, {"jobz": []}).startswith("jobz: not a field")
    # Strict: no text for a number, no 1 for true, no number for a whole number.
    assert refused(schemas.QueuedJobs, {"jobs": [{"key": "a"}], "delay": "5"}) == "delay: a number"
    assert refused(schemas.NewNode, {"address": "h:1", "slots": 1.5}) == "slots: a whole number"
    assert refused(schemas.FamilyNodes, {"nodes": ["h:1"], "allowed": 1}) == (
        "allowed: true or false"
    )
    # A value of the wrong kind gets the field's hint; one out of bounds, the bound.
    change = schemas.TrackingChange
    assert refused(change, {"every": "15m"}).startswith("every: whole seconds")
    assert refused(change, {"cron": "*" * 101}) == "cron: at most 100 characters"
    assert refused(change, {"tags": ["no way"]}).startswith("tags: a list of at most 10 words")
    assert refused(change, {"tags": [f"t{i}" for i in range(11)]}) == "tags: at most 10 items"
    assert refused(change, {"paused": None}) == "paused: true or false"
    for message in (refused(change, {"name": 5}), refused(schemas.FamilyChange, {"timeout": 0})):
        assert "\n" not in message


def test_a_body_keeps_what_it_was_given_and_only_that() -> None:
    change = refusals.validated(schemas.TrackingChange, {"tags": [" Work "], "every": None})
    assert change.model_dump(exclude_unset=True) == {"tags": ["work"], "every": None}
    family = refusals.validated(schemas.FamilyChange, {"idempotent": None, "timeout": 5})
    assert family.model_dump(exclude_unset=True) == {"idempotent": None, "timeout": 5.0}
