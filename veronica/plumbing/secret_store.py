"""Secrets at rest and the mask that keeps their values out of everything we write or send.

* Encryption: Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under the deployment's key,
  VERONICA_SECRETS_KEY: comma-separated Fernet keys for a MultiFernet, the first encrypts and every
  one decrypts, so a new key goes in front, `manage.py rotate_secrets` re-encrypts, then the old
  key can be dropped. The key never touches the database.
* The mask: every secret value this process has set or injected (an MCP server's env, run_command's
  env, a provider key: the only ways a value reaches a run, and each goes through
  veronica.swarm.secrets.values_for, which remembers it) is replaced by `[secret NAME]` in its own
  space's transcripts, tool results, events and error text, and in every trace and log record. No
  query: masking is safe in any context (a log record in an event loop). Values are at least MIN_VALUE characters, so masking
  never eats ordinary words; a deleted or replaced value stays masked for the life of the process.

This module sits low (models only): veronica.swarm.events, veronica.ops.tracing and the agent runtime call
mask(); the verbs that change secrets live in veronica.swarm.secrets.
"""
from __future__ import annotations

import logging
import re
import threading

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


MIN_VALUE = 8


class KeyMissing(Exception):
    pass


_fernets: dict[tuple[str, ...], MultiFernet] = {}


def fernet() -> MultiFernet:
    keys = tuple(settings.SECRETS_KEYS)
    if not keys:
        raise KeyMissing("secrets need VERONICA_SECRETS_KEY (one or more Fernet keys, comma-separated; "
                         "make one with `manage.py rotate_secrets --new-key`)")
    if keys not in _fernets:
        try:
            _fernets[keys] = MultiFernet([Fernet(k.encode()) for k in keys])
        except ValueError:
            raise KeyMissing("VERONICA_SECRETS_KEY holds a key that is not a Fernet key (32 url-safe base64-encoded bytes)") from None
    return _fernets[keys]


def encrypt(value: str) -> str:
    return fernet().encrypt(value.encode()).decode()


def decrypt(ciphertext: str) -> str:
    return fernet().decrypt(ciphertext.encode()).decode()


def rotate(ciphertext: str) -> str:
    """The same value under the first key (MultiFernet.rotate)."""
    return fernet().rotate(ciphertext.encode()).decode()


# --- the mask --------------------------------------------------------------------------------------------

EVERY = None  # mask()'s space for text no tenant sees (log records, traces): every value known


class _Known:
    """Known values by the space they belong to. A tenant's text (its events, transcripts, tool
    results, errors) is masked with its own space's values only: another space's secret masking it
    would rewrite that tenant's stored rows (a value equal to "verifying" or a word of its mail) and
    tell it the other space's secret name, and whether its text holds that secret's value."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.names: dict[object, dict[str, str]] = {}  # space id (EVERY: all) -> value -> name
        self.patterns: dict[object, tuple[dict, re.Pattern]] = {}  # compiled for the names dict it was made from

    def add(self, name: str, value: str, space_id: int) -> None:
        if len(value) < MIN_VALUE or self.names.get(space_id, {}).get(value) == name:
            return
        with self.lock:
            for key in (space_id, EVERY):
                self.names[key] = {**self.names.get(key, {}), value: name}  # a new dict: a pattern made from the old is stale

    def pattern(self, space_id) -> tuple[re.Pattern | None, dict[str, str]]:
        names = self.names.get(space_id)
        if not names:
            return None, {}
        made_from, pattern = self.patterns.get(space_id, (None, None))
        if made_from is not names:
            # longest first: a value that contains another is masked whole
            ordered = sorted(names, key=len, reverse=True)
            pattern = re.compile("|".join(re.escape(v) for v in ordered))
            self.patterns[space_id] = (names, pattern)
        return pattern, names


_known = _Known()


def remember(name: str, value: str, space_id: int) -> None:
    """A value this process has just set or injected for the space: masked from now on."""
    _known.add(name, value, space_id)


def mask(text: str, space_id: int | None = EVERY) -> str:
    """`text` with every known secret value of the space (EVERY: of any space) replaced by
    `[secret NAME]` (no query: safe anywhere)."""
    if not isinstance(text, str) or not text:
        return text
    pattern, names = _known.pattern(space_id)
    if pattern is None:
        return text
    return pattern.sub(lambda m: f"[secret {names.get(m.group(0), '?')}]", text)


def mask_data(data, space_id: int | None = EVERY):
    """mask() over every string inside JSON-like data (event payloads, tool-call arguments); the data
    itself when no secret of the space is known (the common case costs no copy)."""
    if _known.pattern(space_id)[0] is None:
        return data
    return _walk(data, space_id)


def _walk(data, space_id):
    if isinstance(data, str):
        return mask(data, space_id)
    if isinstance(data, dict):
        return {k: _walk(v, space_id) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_walk(v, space_id) for v in data)
    return data


class MaskFilter(logging.Filter):
    """On every log handler: the message and its arguments, the exception text, masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _known.pattern(EVERY)[0] is None:
            return True
        try:
            message = record.getMessage()
        except Exception:
            return True
        masked = mask(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        record.msg, record.args = masked, None
        return True
