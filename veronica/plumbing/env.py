"""Strict environment helpers: a bad value raises at start-up, never silently defaults."""
from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name, "").strip() or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_hosts(name: str) -> list[str]:
    """Comma-separated host names, IP addresses or CIDR networks."""
    import ipaddress

    items = env_list(name)
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            if not item.replace("-", "").replace(".", "").isalnum():
                raise ImproperlyConfigured(f"{name}: {item!r} is neither a host name nor an IP address or network") from None
    return items


def env_url(name: str, schemes: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(f"{name} must start with one of {', '.join(s + '://' for s in schemes)}; got {raw.split('://')[0]!r}")
    return raw


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name, "").strip()
    return Path(raw).expanduser().resolve() if raw else default


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


PRICE_FIELDS = ("input", "output", "cache_read", "cache_write")


def env_prices(name: str) -> dict[str, dict[str, float]]:
    """A JSON file of local price overrides, USD per million tokens:
    {"openai:my-model": {"input": 0.5, "output": 1.5, "cache_read": 0.05, "cache_write": 0}}."""
    import json

    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    path = Path(raw).expanduser()
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r}: cannot read the file ({exc.strerror})") from None
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured(f"{name}={raw!r} must hold an object of model spec -> prices")
    for spec, prices in data.items():
        if not isinstance(prices, dict) or "input" not in prices or "output" not in prices:
            raise ImproperlyConfigured(f"{name}: '{spec}' must be an object with at least 'input' and 'output'")
        for key, value in prices.items():
            if key not in PRICE_FIELDS:
                raise ImproperlyConfigured(f"{name}: '{spec}'.{key} is not one of {', '.join(PRICE_FIELDS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ImproperlyConfigured(f"{name}: '{spec}'.{key}={value!r} must be a number >= 0 (USD per million tokens)")
    return data


def private_dir(path: Path) -> Path:
    """The folder, made (with its parents) if missing; one this call creates is owner-only (0700):
    it holds the secret key, the SQLite database and the workspaces."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # mkdir's mode is cut by the umask; chmod is not
    return path


def private_file(path: Path) -> Path:
    """Create the file empty and owner-only (0600) unless it exists, so what writes it next (SQLite
    opening its database) never makes it readable by others; SQLite gives its -wal and -shm files
    the database file's mode."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        path.chmod(0o600)
    except FileExistsError:
        pass
    return path
