"""Bodies to normalised visible text, titles, selectors and fingerprints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawler_app.fetching.text import (
    SelectorError,
    extract,
    fingerprint,
    html_to_text,
    json_to_text,
    normalise,
)

PAGE = b"""<!doctype html>
<html><head><title>  Weekly
  menu </title><style>body { color: red }</style>
<script>var tracking = "do not show";</script></head>
<body>
  <!-- a comment that changes: 2024-10-01T10:00 -->
  <noscript>Enable JavaScript</noscript>
  <template><p>template text</p></template>
  <header id="top">Site header 10:01</header>
  <main>
    <h1>Menu</h1>
    <p>Soup of the
       day:   <b>tomato</b>&nbsp;soup</p>
    <ul><li>Bread</li><li>Cheese</li></ul>
    <table><tr><th>Day</th><th>Price</th></tr><tr><td>Mon</td><td>4</td></tr></table>
    <pre>line one
  line two</pre>
  </main>
  <script>document.write("nope")</script>
</body></html>"""


def test_hidden_parts_are_dropped_and_blocks_become_lines() -> None:
    text = html_to_text(PAGE)
    assert text.splitlines() == [
        "Site header 10:01",
        "Menu",
        "Soup of the day: tomato soup",
        "Bread",
        "Cheese",
        "Day Price",
        "Mon 4",
        "line one",
        "line two",
    ]
    for hidden in ("tracking", "do not show", "comment", "Enable JavaScript", "template", "nope"):
        assert hidden not in text


def test_title_is_extracted_and_folded() -> None:
    page = extract(PAGE, "text/html; charset=utf-8")
    assert page.title == "Weekly menu"
    assert "Weekly" not in page.text  # the title is not part of the visible body


def test_selector_restricts_text_to_matches() -> None:
    page = extract(PAGE, "text/html", selector="main li, main h1")
    assert (page.text, page.selector_matches) == ("Menu\nBread\nCheese", 3)
    nested = extract(
        b"<div class=a>outer <div class=a>inner</div></div>", "text/html", selector=".a"
    )
    assert nested.text == "outer\ninner"  # nested matches are not repeated
    assert extract(PAGE, "text/html", selector="#missing").text == ""


def test_a_bad_selector_is_an_error() -> None:
    with pytest.raises(SelectorError, match="invalid CSS selector"):
        extract(b"", "text/html", selector="p[")


def test_noise_outside_the_text_keeps_the_fingerprint() -> None:
    a = b"<html><head><script>var t=1</script></head><body><p>Same  text</p><!-- 1 --></body>"
    b = b"<html><head><script>var t=2</script></head><body>\n<p>Same\ntext</p><!-- 2 --></body>"
    assert fingerprint(html_to_text(a)) == fingerprint(html_to_text(b))
    assert fingerprint("Same text") != fingerprint("Same text!")


def test_charsets() -> None:
    assert extract("<p>żółw</p>".encode("iso-8859-2"), "text/html; charset=ISO-8859-2").text == (
        "żółw"
    )
    meta = '<meta charset="windows-1250"><p>żółw</p>'.encode("cp1250")
    assert extract(meta, "text/html").text == "żółw"
    assert extract("<p>café</p>".encode("cp1252"), "text/html").text == "café"
    assert extract("\ufeff<p>bom</p>".encode(), "text/html").text == "bom"
    assert extract(b"<p>x</p>", "text/html; charset=no-such-charset").text == "x"


def test_plain_text_json_and_xml() -> None:
    assert extract(b"  a   b \r\n\r\n c ", "text/plain").text == "a b\nc"
    assert json_to_text('{"b": [1, 2], "a": "x"}') == json_to_text('{"a":"x","b":[1,2]}')
    assert extract(b"not json {", "application/json").text == "not json {"
    feed = b"<?xml version='1.0'?><rss><channel><title>Feed</title><item>One</item></channel></rss>"
    assert extract(feed, "application/rss+xml").text == "Feed\nOne"


def test_xml_entities_are_not_expanded() -> None:
    hostile = (
        b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/hostname">]>'
        b"<r>value:&x;</r>"
    )
    assert extract(hostile, "application/xml").text == "value:"


def test_empty_and_broken_bodies() -> None:
    assert extract(b"", "text/html").text == ""
    assert extract(b"   \n ", "text/html").text == ""
    assert extract(b"<p>unclosed <b>tags", "text/html").text == "unclosed tags"
    assert extract(b"\x00\x01garbage", "text/html").text.endswith(" garbage")
    assert "\x01" not in normalise("a\x01b\x7fc")


@given(st.text())
def test_normalise_is_idempotent_and_fingerprint_stable(text: str) -> None:
    once = normalise(text)
    assert normalise(once) == once
    assert fingerprint(text) == fingerprint(once)
    assert len(fingerprint(text)) == 64


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200))
def test_any_html_body_gives_text_without_raising(body: str) -> None:
    assert isinstance(html_to_text(body), str)


# Markup from which the two HTML walks (line breaks folded, or kept for pre-like
# elements) must draw the same text: line ends of every kind in text and in
# character references, cells, hidden parts with tails, nested blocks, controls.
WALK_PIECES = st.sampled_from(
    ["a", " b ", "\n", "\r\n", "\u2028", "\u2029", "&#10;", "&#13;", "&#x2028;", "\t",
     "\u00a0", "\x0b", "\x1c", "\x85", "e\u0301", "&amp;", "<br>", "<p>", "</p>", "<div>",
     "</div>", "<td>", "</td>", "<th>x</th>", "<span>", "</span>", "<b>", "</b>",
     "<script>s\n</script>", "<style>t</style>", "<noscript>n</noscript>", "<li>", "<TR>",
     "<title>t\n</title>", "<template>x</template>", "<!-- c\n -->", "\U0010fffd"]
)  # fmt: skip


@given(st.lists(WALK_PIECES, max_size=40))
def test_the_quick_html_walk_gives_the_text_of_the_exact_one(pieces: list[str]) -> None:
    from crawler_app.fetching.text import _visible_lines, _visible_lines_kept, parse_html

    root = parse_html("".join(pieces))
    if root is not None:
        assert normalise(_visible_lines(root)) == normalise(_visible_lines_kept(root))
