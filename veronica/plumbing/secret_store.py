"""Secrets at rest and the mask that keeps their values out of everything we write or send.

* Encryption: Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under the deployment's key,
  VERONICA_SECRETS_KEY: comma-separated Fernet keys for a MultiFernet, the first encrypts and every
  one decrypts, so a new key goes in front, `manage.py rotate_secrets` re-encrypts, then the old
  key can be dropped. The key never touches the database.
* The mask: every secret value this process has set or injected (an MCP server's env, run_command's
  env, a provider key: the only ways a value reaches a run, and each goes through
  veronica.swarm.secrets.values_for, which remembers it) is replaced by `[secret NAME]` in transcripts,
  tool results, events, traces, error text and log records. No query: masking is safe in any
  context (a log record in an event loop). Values are at least MIN_VALUE characters, so masking
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

class _Known:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, str] = {}  # value -> name
        self.pattern: re.Pattern | None = None

    def add(self, name: str, value: str) -> None:
        if len(value) < MIN_VALUE or self.values.get(value) == name:
            return
        with self.lock:
            self.values[value] = name
            self._compile()

    def _compile(self) -> None:
        # longest first: a value that contains another is masked whole
        ordered = sorted(self.values, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None


_known = _Known()


def remember(name: str, value: str) -> None:
    """A value this process has just set or injected: masked from now on."""
    _known.add(name, value)


def mask(text: str) -> str:
    """`text` with every known secret value replaced by `[secret NAME]` (no query: safe anywhere)."""
    if not isinstance(text, str) or not text:
        return text
    pattern = _known.pattern
    if pattern is None:
        return text
    return pattern.sub(lambda m: f"[secret {_known.values.get(m.group(0), '?')}]", text)


def mask_data(data):
    """mask() over every string inside JSON-like data (event payloads, tool-call arguments); the data
    itself when no secret is known (the common case costs no copy)."""
    if _known.pattern is None:
        return data
    return _walk(data)


def _walk(data):
    if isinstance(data, str):
        return mask(data)
    if isinstance(data, dict):
        return {k: _walk(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_walk(v) for v in data)
    return data


class MaskFilter(logging.Filter):
    """On every log handler: the message and its arguments, the exception text, masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _known.pattern is None:
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
