"""Markdown from models and users: rendered by python-markdown, then sanitized by nh3 (always).

Agent text is not written for python-markdown's quirks, so two are taken out before rendering (never
inside code): a `#` glued to its text (`- #1 [done] …`, an issue number) is not a heading, as in
CommonMark, which wants a space after the hashes; and a dunder name (`__init__.py`, `__main__`) is
not bold. A line break inside a paragraph is kept (nl2br): a 3-line goal shows as 3 lines.
"""
from __future__ import annotations

import functools
import re
import threading

import markdown as md
import nh3
from django.utils.safestring import SafeString, mark_safe

ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "b", "i", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "del", "span",
}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}, "code": {"class"}, "span": {"class"}}
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
# hashes glued to their text at a line's start, or a list item's: not a heading (CommonMark needs a space)
GLUED_HASH = re.compile(r"^(\s*(?:[-*+]|\d+[.)])\s+|\s{0,3})(#{1,6})(?=[^\s#])")
DUNDER = re.compile(r"(?<![\w\\])__([a-z0-9][a-z0-9_]*?)__(?![A-Za-z0-9_])")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


def _plain_line(line: str) -> str:
    line = GLUED_HASH.sub(lambda m: m.group(1) + "\\" + m.group(2), line)
    out, last = [], 0
    for span in CODE_SPAN.finditer(line):  # code spans are shown as written
        out.append(DUNDER.sub(r"\\_\\_\1\\_\\_", line[last:span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(DUNDER.sub(r"\\_\\_\1\\_\\_", line[last:]))
    return "".join(out)


def agent_text(text: str) -> str:
    """The text with the two quirks escaped, fenced code blocks untouched."""
    lines, fence = [], None
    for line in text.split("\n"):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0]
        elif fence is not None and opened and opened.group(1)[0] == fence:
            fence = None
        elif fence is None and not line.startswith(("    ", "\t")):
            line = _plain_line(line)
        lines.append(line)
    return "\n".join(lines)


EXTENSIONS = ["fenced_code", "tables", "sane_lists", "nl2br"]
_local = threading.local()  # a Markdown instance is not thread-safe: one per thread


def _converter() -> md.Markdown:
    """This thread's Markdown instance, reset before each use. Building one loads its extensions and
    registers ~40 processors: two thirds of the cost of a short message (the chat panel renders 30)."""
    converter = getattr(_local, "converter", None)
    if converter is None:
        converter = _local.converter = md.Markdown(extensions=EXTENSIONS)
    return converter.reset()


# A live page re-renders the same texts on each refresh (the chat panel's 30 messages on every message, a
# member's transcript on each of its events): a text's HTML is a pure function of the text, so the recent
# ones are kept. Bounded: RENDER_CACHE texts of up to CACHED_TEXT_MAX characters (a few MB at most); a longer
# text renders each time.
RENDER_CACHE = 512
CACHED_TEXT_MAX = 4000


def render_markdown(text: str) -> SafeString:
    text = text or ""
    return _cached_render(text) if len(text) <= CACHED_TEXT_MAX else _render(text)


@functools.lru_cache(maxsize=RENDER_CACHE)
def _cached_render(text: str) -> SafeString:
    return _render(text)


def _render(text: str) -> SafeString:
    html = _converter().convert(agent_text(text))
    clean = nh3.clean(html, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
                      link_rel="noopener noreferrer nofollow")
    return mark_safe(clean)  # noqa: S308 - nh3 output with an allow-list
