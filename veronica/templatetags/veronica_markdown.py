from django import template

from veronica.plumbing.markdown import render_markdown

register = template.Library()


@register.filter(name="markdown")
def markdown_filter(text: str):
    """Markdown rendered and sanitized (nh3) — never raw model or user HTML."""
    return render_markdown(text or "")
