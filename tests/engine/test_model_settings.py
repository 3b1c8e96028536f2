"""Model settings are read, and bad values refused with the variable's name, at start-up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def manage_check(tmp_path, **extra) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update(VERONICA_DATA_DIR=str(tmp_path), **extra)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=environ, capture_output=True, text=True)


@pytest.mark.parametrize("name,value", [("VERONICA_MODEL_TIMEOUT", "fast"), ("VERONICA_MODEL_TIMEOUT", "0"),
                                        ("VERONICA_MODEL_MAX_RETRIES", "-1"), ("VERONICA_MODEL_BACKOFF", "nan"),
                                        ("VERONICA_MODEL_MAX_TOKENS", "lots"), ("VERONICA_MODEL_STREAM", "maybe"),
                                        ("VERONICA_MODEL_PRICES", "/nonexistent/prices.json"),
                                        ("OPENAI_BASE_URL", "localhost:8000/v1"), ("ANTHROPIC_BASE_URL", "ftp://x")])
def test_bad_model_settings_are_refused_at_startup_naming_the_variable(tmp_path, name, value):
    result = manage_check(tmp_path, **{name: value})
    assert result.returncode != 0 and name in result.stderr, result.stderr[-500:]


def test_a_price_file_with_a_bad_entry_is_refused(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:local": {"input": "cheap", "output": 0}}))
    result = manage_check(tmp_path, VERONICA_MODEL_PRICES=str(prices))
    assert result.returncode != 0 and "VERONICA_MODEL_PRICES: 'openai:local'.input" in result.stderr


def test_good_model_settings_pass(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:local": {"input": 0.1, "output": 0.2, "cache_read": 0.01}}))
    result = manage_check(tmp_path, VERONICA_MODEL_TIMEOUT="30", VERONICA_MODEL_MAX_RETRIES="2", VERONICA_MODEL_STREAM="0",
                          VERONICA_MODEL_PRICES=str(prices), OPENAI_BASE_URL="http://127.0.0.1:8000/v1")
    assert result.returncode == 0, result.stderr[-500:]


def test_every_model_variable_is_in_the_readme():
    readme = (REPO / "README.md").read_text()
    settings_py = (REPO / "veronica" / "settings.py").read_text()
    import re

    names = set(re.findall(r'"((?:VERONICA_MODEL|OPENAI|ANTHROPIC)_[A-Z_]+)"', settings_py)) | {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    missing = sorted(n for n in names if f"`{n}`" not in readme)
    assert not missing, f"not in README: {missing}"
