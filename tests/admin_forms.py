"""Submit an admin form as a browser would: every field of the rendered <form>, unmodified."""
from __future__ import annotations

from html import unescape
from html.parser import HTMLParser


class _FormReader(HTMLParser):
    """The (name, value) pairs a browser submits for the form with the given id."""

    def __init__(self, form_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id, self.inside, self.pairs = form_id, False, []
        self._select: tuple[str, bool] | None = None  # (name, multiple)
        self._selected: list[str] = []
        self._first_option: str | None = None
        self._option: dict | None = None
        self._textarea: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        if not self.inside or "disabled" in a:
            return
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text").lower()
            if kind in ("submit", "button", "file", "image", "reset"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self.pairs.append((a["name"], a.get("value", "on" if kind in ("checkbox", "radio") else "")))
        elif tag == "textarea" and a.get("name"):
            self._textarea, self._text = a["name"], []
        elif tag == "select" and a.get("name"):
            self._select, self._selected, self._first_option = (a["name"], "multiple" in a), [], None
        elif tag == "option" and self._select is not None:
            self._option = {"value": a.get("value"), "selected": "selected" in a, "text": []}

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)
        elif self._option is not None:
            self._option["text"].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.inside:
            self.inside = False
        elif tag == "textarea" and self._textarea is not None:
            text = "".join(self._text)
            self.pairs.append((self._textarea, text[1:] if text.startswith("\n") else text))  # a browser drops one leading newline
            self._textarea = None
        elif tag == "option" and self._option is not None:
            value = self._option["value"] if self._option["value"] is not None else unescape("".join(self._option["text"]).strip())
            if self._first_option is None:
                self._first_option = value
            if self._option["selected"]:
                self._selected.append(value)
            self._option = None
        elif tag == "select" and self._select is not None:
            name, multiple = self._select
            chosen = self._selected if multiple or self._selected else [self._first_option] if self._first_option is not None else []
            self.pairs += [(name, v) for v in chosen]
            self._select = None


def form_data(html: str, form_id: str) -> dict[str, list[str]]:
    reader = _FormReader(form_id)
    reader.feed(html)
    data: dict[str, list[str]] = {}
    for name, value in reader.pairs:
        data.setdefault(name, []).append(value)
    return data
