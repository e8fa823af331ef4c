"""Page bodies to normalised visible text, and the fingerprint of that text.

The checker compares *what a reader sees*, not bytes: markup, scripts, styles,
``noscript``, ``template`` and comments are dropped, each block element starts a
new line, whitespace inside a line is folded to single spaces, blank lines are
removed and the text is put in Unicode NFC form. An optional selector
restricts the text to what it picks: a CSS selector or an XPath expression in
HTML and XML (e.g. ``#prices`` to ignore a changing sidebar), a JSONPath
expression in JSON (:func:`parse_selector` tells them apart). JSON is
re-serialised with sorted keys so key order does not count; plain text is only
folded.

:func:`fingerprint` is the SHA-256 of the normalised text; two fetches whose
visible text is the same have the same fingerprint.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import lxml.etree
from cssselect import SelectorError as _CssSelectorError
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext import parse as _jsonpath_parse
from lxml.cssselect import CSSSelector

#: Elements whose content is never visible text.
HIDDEN_TAGS = frozenset(
    {"script", "style", "noscript", "template", "head", "iframe", "object", "embed", "svg"}
)
#: Elements that start a new line of text.
BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "caption", "dd", "details",
        "dialog", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form",
        "h1", "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "li", "main", "nav",
        "ol", "option", "p", "pre", "section", "summary", "table", "tbody", "tfoot", "thead",
        "tr", "ul", "title", "body", "html",
    }
)  # fmt: skip
#: Elements whose own line breaks are kept.
PRE_TAGS = frozenset({"pre", "textarea", "listing", "plaintext"})
#: Longest title kept, in characters.
MAX_TITLE_CHARS = 300

_WS = re.compile(r"\s+")
# C0/C1 control characters other than line breaks and tabs: never visible text.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_:.-]+)""", re.I)


#: Selector kinds, and the prefixes that name them explicitly (``xpath://p``).
CSS, XPATH, JSONPATH = "css", "xpath", "jsonpath"
_PREFIXES = (CSS, XPATH, JSONPATH)
_KIND_NAMES = {CSS: "CSS selector", XPATH: "XPath expression", JSONPATH: "JSONPath expression"}


class SelectorError(ValueError):
    """A CSS selector, XPath or JSONPath expression that cannot be parsed."""


@dataclass(frozen=True)
class Selector:
    """A parsed selector: its kind, its expression, and the compiled form.

    ``text`` is how it is stored: a CSS selector as it is (what trackings stored
    before XPath and JSONPath existed), the others with their prefix.
    """

    kind: str
    expression: str
    compiled: Any

    @property
    def text(self) -> str:
        return self.expression if self.kind == CSS else f"{self.kind}:{self.expression}"

    @property
    def name(self) -> str:
        """``CSS selector '#a'``: the selector as a message names it."""
        return f"{_KIND_NAMES[self.kind]} {self.expression!r}"


@dataclass(frozen=True)
class Extract:
    """What a body says: its title (HTML only), normalised text, selector matches."""

    title: str | None
    text: str
    selector_matches: int | None = None


def fingerprint(text: str, *, normalised: bool = False) -> str:
    """SHA-256 hex digest of ``text`` after normalisation (see :func:`normalise`).

    ``normalised=True`` says ``text`` came from :func:`normalise` unchanged (the
    digest is the same, without normalising twice).
    """
    if not normalised:
        text = normalise(text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalise(text: str) -> str:
    """Fold whitespace within lines, drop blank lines and control characters, NFC-normalise."""
    text = unicodedata.normalize("NFC", _CONTROLS.sub(" ", text))
    # str.split() folds and strips exactly the whitespace _WS matches, in C.
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def media_type(content_type: str | None) -> str:
    """``text/html; charset=utf-8`` → ``text/html`` (lower case; empty if absent)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def charset_of(content_type: str | None) -> str | None:
    """The known charset named in a Content-Type header, if any."""
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return _known_encoding(value.strip().strip("\"'"))
    return None


def _known_encoding(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def _decode(body: bytes, charset: str | None) -> str:
    if body.startswith(codecs.BOM_UTF8):
        return body[3:].decode("utf-8", errors="replace")
    if charset:
        return body.decode(charset, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("cp1252", errors="replace")


def _html_encoding(body: bytes, charset: str | None) -> str:
    """Header charset, else a BOM, else ``<meta charset>``, else UTF-8 if valid, else cp1252."""
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8"
    if charset:
        return charset
    match = _META_CHARSET.search(body[:4096])
    declared = _known_encoding(match.group(1).decode("ascii")) if match else None
    if declared:
        return declared
    try:
        body.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        return "cp1252"


def parse_html(body: bytes | str, *, charset: str | None = None) -> lxml.etree._Element | None:
    """Parse an HTML document leniently; None when it holds no element at all.

    Plain lxml elements: lxml.html's element classes would be looked up in Python
    for every element the text walk touches.
    """
    if isinstance(body, str):
        body = body.encode("utf-8")
        charset = "utf-8"
    if not body.strip():
        return None
    parser = lxml.etree.HTMLParser(
        encoding=_html_encoding(body, charset),
        remove_comments=True,
        remove_pis=True,
        no_network=True,
    )
    try:
        return lxml.etree.fromstring(body, parser=parser)
    except (lxml.etree.ParserError, ValueError):
        return None


def _visible_lines(root: lxml.etree._Element, *, xml: bool = False) -> str:
    """Visible text of ``root`` with block boundaries as newlines, for :func:`normalise`.

    In XML (``xml=True``) every element is a block. Whitespace is not folded yet;
    only what :func:`normalise` makes of the result is defined.
    """
    if xml or next(root.iter(*PRE_TAGS), None) is not None:
        return _visible_lines_kept(root, xml=xml)
    # An HTML tree without pre-like elements: every line end inside the text folds to
    # a space, so the text goes out as it is and block boundaries are marked with NUL
    # (never in lxml's strings, which are C strings), made newlines at the end.
    out: list[str] = []
    append = out.append
    walker = lxml.etree.iterwalk(root, events=("start", "end"))
    for event, el in walker:
        tag = el.tag  # the HTML parser gives lower-case names
        if event == "start":
            if tag in HIDDEN_TAGS or not isinstance(tag, str):
                walker.skip_subtree()
                continue
            if tag in BLOCK_TAGS:
                append("\x00")
            if el.text:
                append(el.text)
        else:
            if tag in BLOCK_TAGS:
                append("\x00")
            elif tag == "td" or tag == "th":
                append(" ")
            if el is not root and el.tail:
                append(el.tail)
    text = "".join(out).replace("\n", " ").replace("\r", " ")
    if "\u2028" in text or "\u2029" in text:
        text = text.replace("\u2028", " ").replace("\u2029", " ")
    return text.replace("\x00", "\n")


def _visible_lines_kept(root: lxml.etree._Element, *, xml: bool = False) -> str:
    """:func:`_visible_lines` for XML and for trees with ``pre``-like elements,
    whose own line breaks are kept."""
    out: list[str] = []
    pre_depth = 0
    walker = lxml.etree.iterwalk(root, events=("start", "end"))
    for event, el in walker:
        tag = el.tag.lower() if isinstance(el.tag, str) else None
        if tag is not None and "}" in tag:
            tag = tag.rsplit("}", 1)[1]
        if event == "start":
            if tag is None or tag in HIDDEN_TAGS:
                walker.skip_subtree()
                continue
            if xml or tag in BLOCK_TAGS:
                out.append("\n")
            if tag in PRE_TAGS:
                pre_depth += 1
            if el.text:
                out.append(el.text if pre_depth else _WS.sub(" ", el.text))
        else:
            if tag is not None and tag not in HIDDEN_TAGS:
                if tag in PRE_TAGS:
                    pre_depth -= 1
                if xml or tag in BLOCK_TAGS:
                    out.append("\n")
                elif tag in ("td", "th"):
                    out.append(" ")
            if el is not root and el.tail:
                out.append(el.tail if pre_depth else _WS.sub(" ", el.tail))
    return "".join(out)


def selector_kind(selector: str) -> tuple[str, str]:
    """``(kind, expression)`` of a selector as typed: an explicit ``css:``, ``xpath:`` or
    ``jsonpath:`` prefix; else XPath when it starts with ``/`` or ``(``, JSONPath with
    ``$``, CSS otherwise."""
    head, sep, rest = selector.partition(":")
    if sep and head.strip().lower() in _PREFIXES:
        return head.strip().lower(), rest.strip()
    if selector.startswith(("/", "(")):
        return XPATH, selector
    if selector.startswith("$"):
        return JSONPATH, selector
    return CSS, selector


def parse_selector(selector: str) -> Selector:
    """Parse and compile a selector (see :func:`selector_kind`); raises
    :class:`SelectorError` with one line naming it."""
    kind, expression = selector_kind(selector.strip())
    name = f"{_KIND_NAMES[kind]} {expression!r}"
    if not expression:
        raise SelectorError(f"empty {_KIND_NAMES[kind]}")
    try:
        if kind == CSS:
            compiled: Any = CSSSelector(expression)
        elif kind == XPATH:
            compiled = lxml.etree.XPath(expression, smart_strings=False)
            # Some errors (a wrong number of arguments, an unknown function) show only
            # when the expression runs: run it once on an empty document.
            compiled(lxml.etree.Element("html"))
        else:
            compiled = _jsonpath_parse(expression)
    except (_CssSelectorError, SyntaxError, ValueError, lxml.etree.XPathError) as exc:
        raise SelectorError(f"invalid {name}: {_first_line(exc)}") from None
    except (JsonPathLexerError, JsonPathParserError, Exception) as exc:  # noqa: B014
        # jsonpath-ng raises bare Exceptions for some syntax errors.
        raise SelectorError(f"invalid {name}: {_first_line(exc)}") from None
    return Selector(kind, expression, compiled)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def compile_selector(selector: str) -> Selector:
    """Check a selector (CSS, XPath or JSONPath); raises :class:`SelectorError`."""
    return parse_selector(selector)


def _select(root: lxml.etree._Element, selector: Selector) -> list[Any]:
    """What ``selector`` picks in ``root``: elements (outermost only), or strings."""
    try:
        found = selector.compiled(root)
    except lxml.etree.XPathError as exc:
        raise SelectorError(f"{selector.name} fails on this page: {_first_line(exc)}") from None
    if not isinstance(found, list):  # an XPath number, string or boolean
        found = [] if found is None or found is False else [found]
    elements = [el for el in found if isinstance(el, lxml.etree._Element)]
    chosen = set(elements)
    # Keep outermost matches only, so nested matches do not repeat their text.
    return [
        el
        for el in found
        if not isinstance(el, lxml.etree._Element)
        or not any(a in chosen for a in el.iterancestors())
    ]


def _match_text(match: Any, *, xml: bool) -> str:
    if isinstance(match, lxml.etree._Element):
        return _visible_lines(match, xml=xml)
    if isinstance(match, bool):
        return "true" if match else "false"
    if isinstance(match, float) and match.is_integer():
        return str(int(match))
    return str(match)


def html_title(root: lxml.etree._Element) -> str | None:
    """The document's ``<title>``, whitespace folded and shortened; None if absent."""
    for el in root.iter("title"):
        title = normalise(" ".join(el.itertext())).replace("\n", " ")
        return title[:MAX_TITLE_CHARS] or None
    return None


def element_text(
    root: lxml.etree._Element, selector: str | None = None, *, xml: bool = False
) -> tuple[str, int | None]:
    """Normalised visible text of ``root`` (or of its ``selector`` matches) and the match count.

    A JSONPath expression matches nothing in a tree."""
    if selector is None:
        return normalise(_visible_lines(root, xml=xml)), None
    parsed = parse_selector(selector)
    if parsed.kind == JSONPATH:
        return "", 0
    matches = _select(root, parsed)
    return normalise("\n".join(_match_text(m, xml=xml) for m in matches)), len(matches)


def html_to_text(
    body: bytes | str, *, selector: str | None = None, charset: str | None = None
) -> str:
    """Normalised visible text of an HTML document (see the module doc)."""
    if selector is not None:
        compile_selector(selector)  # a bad selector is an error even on an empty page
    root = parse_html(body, charset=charset)
    if root is None:
        return ""
    return element_text(root, selector)[0]


def json_to_text(body: bytes | str, *, charset: str | None = None) -> str:
    """JSON re-serialised with sorted keys, one value per line; plain text if not JSON."""
    text = body if isinstance(body, str) else _decode(body, charset)
    try:
        value = json.loads(text)
    except ValueError:
        return normalise(text)
    return _json_lines(value)


def _json_lines(value: Any) -> str:
    if isinstance(value, str):
        return normalise(value)
    return normalise(json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False))


def json_select(
    body: bytes | str, selector: Selector, *, charset: str | None = None
) -> tuple[str, int]:
    """The text of what a JSONPath expression picks in a JSON body (each value as
    :func:`json_to_text` writes it; a string as it is), and how many values; a body
    that is not JSON matches nothing."""
    text = body if isinstance(body, str) else _decode(body, charset)
    try:
        value = json.loads(text)
    except ValueError:
        return "", 0
    try:
        found = [match.value for match in selector.compiled.find(value)]
    except Exception as exc:  # a filter comparing values of other types, ...
        raise SelectorError(f"{selector.name} fails on this page: {_first_line(exc)}") from None
    return normalise("\n".join(_json_lines(v) for v in found)), len(found)


def _parse_xml(body: bytes) -> lxml.etree._Element | None:
    # No DTDs, no entity expansion, no network: an XML body must not read local files.
    parser = lxml.etree.XMLParser(
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        remove_comments=True,
        remove_pis=True,
        huge_tree=False,
    )
    try:
        return lxml.etree.fromstring(body, parser=parser)
    except lxml.etree.XMLSyntaxError:
        return None


def extract(body: bytes, content_type: str | None, *, selector: str | None = None) -> Extract:
    """Title and normalised text of a body of the given Content-Type.

    HTML and XHTML go through the HTML parser, other XML through a safe XML
    parser, JSON is canonicalised, anything else is decoded as text. A CSS or
    XPath selector applies to HTML and XML, a JSONPath one to JSON (elsewhere it
    matches nothing). Raises :class:`SelectorError`.
    """
    # A bad selector is an error even on an empty page.
    parsed = parse_selector(selector) if selector is not None else None
    kind = media_type(content_type)
    charset = charset_of(content_type)
    is_json = kind == "application/json" or kind.endswith("+json")
    is_xml = (kind.endswith("/xml") or kind.endswith("+xml")) and kind != "application/xhtml+xml"
    if parsed is not None and parsed.kind == JSONPATH:
        if not is_json and kind not in ("text/plain", "text/javascript", ""):
            return Extract(None, "", 0)
        return Extract(None, *json_select(body, parsed, charset=charset))
    if is_json:
        return Extract(None, json_to_text(body, charset=charset))
    if is_xml:
        xml_root = _parse_xml(body)
        if xml_root is not None:
            text, matches = element_text(xml_root, selector, xml=True)
            return Extract(None, text, matches)
    if kind in ("text/html", "application/xhtml+xml") or is_xml:
        root = parse_html(body, charset=charset)
        if root is None:
            return Extract(None, "", 0 if selector is not None else None)
        text, matches = element_text(root, selector)
        return Extract(html_title(root), text, matches)
    return Extract(None, normalise(_decode(body, charset)))
