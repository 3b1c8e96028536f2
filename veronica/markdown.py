"""Markdown from models and users: rendered by python-markdown, then sanitized by nh3 (always)."""
from __future__ import annotations

import markdown as md
import nh3
from django.utils.safestring import SafeString, mark_safe

ALLOWED_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "b", "i", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "del", "span",
}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "th": {"align"}, "td": {"align"}, "code": {"class"}, "span": {"class"}}


def render_markdown(text: str) -> SafeString:
    html = md.markdown(text or "", extensions=["fenced_code", "tables", "sane_lists"])
    clean = nh3.clean(html, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
                      link_rel="noopener noreferrer nofollow")
    return mark_safe(clean)  # noqa: S308 - nh3 output with an allow-list
