"""Big spaces stay fast (issue 25.4): what a page's rendering costs per row, kept bounded.

The chat panel renders 30 messages as markdown on every refresh: one Markdown converter per thread,
reset between texts, not one built per text (building one loads four extensions and ~40 processors,
two thirds of a short message's cost); a reset converter renders each text as a fresh one would."""
from __future__ import annotations

import threading

import markdown as md

from veronica.plumbing import markdown as vmd

TEXTS = [
    "[ref]: https://example.org/a\nsee [the ref][ref]",  # a reference definition: must not reach the next text
    "see [the ref][ref]",
    "```\n<b>x</b>\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |",  # fenced code (stashed) and a table
    "one\ntwo\n\n1. #1 done\n2. __init__.py",
    "<div>raw html</div> and *em*",
    "",
]


def test_a_reused_converter_renders_each_text_as_a_fresh_one_would():
    for text in TEXTS + TEXTS[::-1]:
        fresh = md.markdown(vmd.agent_text(text), extensions=vmd.EXTENSIONS)
        assert vmd._converter().convert(vmd.agent_text(text)) == fresh, text


def test_a_reference_defined_in_one_text_does_not_resolve_in_the_next():
    vmd.render_markdown(TEXTS[0])
    assert "<a" not in vmd.render_markdown(TEXTS[1])


def test_thirty_messages_build_one_converter_per_thread(monkeypatch):
    built = []
    real_init = md.Markdown.__init__

    def counting_init(self, *args, **kwargs):
        built.append(threading.get_ident())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(md.Markdown, "__init__", counting_init)
    monkeypatch.setattr(vmd, "_local", threading.local())
    for i in range(30):
        vmd.render_markdown(f"note **{i}**")
    other = threading.Thread(target=lambda: vmd.render_markdown("from another thread"))
    other.start()
    other.join()
    assert len(built) == 2 and len(set(built)) == 2, f"converters built: {len(built)} (one per thread expected)"
