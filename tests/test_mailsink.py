"""jodl up's local mail sink (a real aiosmtpd server) and failure reasons on run pages."""

from __future__ import annotations

import smtplib
import stat
from email.message import EmailMessage
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_web_views import XSS_TEXT, admin_client, app, assert_safe, text_of  # noqa: F401

from jodl.log.models import ExecState, Execution, utcnow
from web.mailsink import CONFIG_KEY, PREVIEW_BYTES, MailSink


def mail(to: str, text: str = "hello") -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "jodl@localhost"
    msg["To"] = to
    msg["Subject"] = f"for {to}"
    msg.set_content(text)
    return msg


def send(sink: MailSink, msg: EmailMessage) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=30) as smtp:
        smtp.send_message(msg)


def test_the_sink_keeps_each_message_as_a_file_and_shows_it_to_operators(
    app: Flask,  # noqa: F811
    admin_client: FlaskClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    sink = MailSink(tmp_path / "mail")
    sink.start()
    try:
        msg = EmailMessage()
        msg["From"] = "jodl@localhost"
        msg["To"] = "alice@example.org"
        msg["Subject"] = "2 pages changed <script>alert(1)</script>"
        msg.set_content("https://example.org/news changed\n" + XSS_TEXT)
        with smtplib.SMTP("127.0.0.1", sink.port, timeout=30) as smtp:
            smtp.send_message(msg)
    finally:
        sink.stop()
    (saved,) = (tmp_path / "mail").glob("*.eml")
    assert b"alice@example.org" in saved.read_bytes()

    app.config[CONFIG_KEY] = str(tmp_path / "mail")
    page = admin_client.get("/admin/mail")
    assert page.status_code == 200
    text = text_of(assert_safe(page.get_data(as_text=True)))
    assert "2 pages changed <script>alert(1)</script>" in text
    assert "https://example.org/news changed" in text and "alice@example.org" in text
    assert "Mail sink" in admin_client.get("/admin/").get_data(as_text=True)


def test_the_mail_page_is_for_operators_only(app: Flask) -> None:  # noqa: F811
    assert app.test_client().get("/admin/mail").status_code in (302, 303, 401, 403)


def test_a_run_page_shows_why_attempts_failed(
    app: Flask,  # noqa: F811
    admin_client: FlaskClient,  # noqa: F811
) -> None:
    store = app.extensions["jodl"].store
    fam = store.ensure_family("notify")
    store.add_jobs(fam, {"alice@example.org": {}})
    run, _ = store.open_run(fam, 1)
    node = store.add_node("127.0.0.1:9")
    (job_id,) = [j.id for j in store.run_jobs(run, "notify")]
    reason = "SMTP error: ConnectionRefusedError: [Errno 111] Connection refused"
    with store.session() as s, s.begin():
        for attempt in (1, 2):
            s.add(
                Execution(
                    id=attempt,
                    run_id=run.id,
                    job_id=job_id,
                    node_id=node.id,
                    attempt=attempt,
                    state=ExecState.FAILED,
                    sent_at=utcnow(),
                    error=reason,
                )
            )
    page = admin_client.get(f"/admin/runs/{run.id}")
    doc = assert_safe(page.get_data(as_text=True))
    # Both attempts in the failures table, and again in the listing of the run's jobs.
    for table in ("failures", "jobs"):
        (found,) = doc.xpath(f"//table[@id='{table}']")
        assert found.text_content().count(reason) == 2, table
    text = text_of(doc)
    assert "alice@example.org" in text and "127.0.0.1:9" in text


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_sinks_folder_and_files_are_the_owners_only(tmp_path: Path) -> None:
    """Issue 20: sign-up links are in the messages; no other local user reads them."""
    folder = tmp_path / "mail"
    folder.mkdir(mode=0o755)  # as an older version left it
    folder.chmod(0o755)
    sink = MailSink(folder)
    sink.start()
    try:
        send(sink, mail("alice@example.org", "https://jodl.example/confirm/secret-token"))
    finally:
        sink.stop()
    (saved,) = folder.glob("*.eml")
    assert (mode(folder), mode(saved)) == (0o700, 0o600)


def test_the_sink_bounds_each_message_and_all_of_them(tmp_path: Path) -> None:
    folder = tmp_path / "mail"
    sink = MailSink(folder, max_message=10_000, max_total=30_000)
    sink.start()
    try:
        with pytest.raises(smtplib.SMTPResponseException) as refused:
            send(sink, mail("big@example.org", "x" * 20_000))
        assert refused.value.smtp_code == 552
        for i in range(8):
            send(sink, mail(f"user{i}@example.org", "y" * 7_000))
    finally:
        sink.stop()
    kept = sorted(folder.glob("*.eml"))
    assert sum(p.stat().st_size for p in kept) <= 30_000
    # The newest are kept, the oldest went.
    assert b"user7@example.org" in kept[-1].read_bytes()
    assert not any(b"user0@example.org" in p.read_bytes() for p in kept)


def test_the_mail_page_reads_only_the_start_of_a_long_message(
    app: Flask,  # noqa: F811
    admin_client: FlaskClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    folder = tmp_path / "mail"
    folder.mkdir()
    long_text = "".join(f"line {i} of a long message\n" for i in range(100_000))
    (folder / "20260101T000000-1-00001.eml").write_bytes(
        mail("alice@example.org", long_text).as_bytes()
    )
    app.config[CONFIG_KEY] = str(folder)
    page = admin_client.get("/admin/mail")
    assert page.status_code == 200
    text = text_of(assert_safe(page.get_data(as_text=True)))
    assert "for alice@example.org" in text and "line 0 of a long message" in text
    assert "line 99999 of a long message" not in text
    assert "the rest is in 20260101T000000-1-00001.eml" in text
    assert len(text) < 2 * PREVIEW_BYTES
