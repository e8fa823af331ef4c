"""Schemathesis against a live ``jodl web``: the API answers as its OpenAPI document says.

Every operation of ``/api/openapi.json`` gets generated requests as an anonymous
visitor, a user and an operator (bearer tokens: no password hash per request).
Any 5xx, undocumented status, content type, header or body fails the test. The
examples per operation are bounded so the run stays well under two minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.orm import sessionmaker
from webserver import WebProcess, start_web

from crawler_app.users.pages import add_user
from jodl.log import make_engine
from jodl.log.migrate import upgrade

PASSWORD = "correct horse battery"
#: Generated requests per operation and role.
EXAMPLES = 12
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
#: Operations a signed-in role leaves out: logging out would revoke its own token.
ANONYMOUS_ONLY = {("DELETE", "/api/session")}


@pytest.fixture
def live(pg_database: str, tmp_path: Path) -> Iterator[WebProcess]:
    engine = make_engine(pg_database)
    upgrade(engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, "user@example.org", PASSWORD)
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
    engine.dispose()
    web = start_web(
        pg_database,
        tmp_path,
        {
            "JODL_WEB_ANONYMOUS_SUBMIT": "true",
            "JODL_WEB_ANONYMOUS_BURST": "100000",
            "JODL_WEB_SUBMIT_BURST": "100000",
            # Operators' status stream: two events, then it ends (the client resumes).
            "JODL_WEB_STREAM_SECONDS": "0.5",
        },
    )
    try:
        yield web
    finally:
        web.stop()


def token(web: WebProcess, email: str) -> dict[str, str]:
    r = httpx.post(web.url + "/api/tokens", json={}, auth=(email, PASSWORD), timeout=30)
    assert r.status_code == 201, r.text
    return {"Authorization": "Bearer " + r.json()["token"]}


def test_the_api_answers_as_its_document_says(live: WebProcess) -> None:
    schema = schemathesis.openapi.from_url(live.url + "/api/openapi.json")
    roles: dict[str, dict[str, str]] = {
        "anonymous": {},
        "user": token(live, "user@example.org"),
        "operator": token(live, "ops@example.org"),
    }
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        for role, headers in roles.items():
            if role != "anonymous" and (operation.method.upper(), operation.path) in ANONYMOUS_ONLY:
                continue
            _fuzz(live, operation, headers)


def _fuzz(web: WebProcess, operation: Any, headers: dict[str, str]) -> None:
    """Generated requests to ``operation``; the first failure, shrunk, fails the test
    (schemathesis reports the check, the answer and a curl line to reproduce it)."""

    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call(base_url=web.url, headers=headers, timeout=30)
        case.validate_response(response, checks=CHECKS)

    run()
