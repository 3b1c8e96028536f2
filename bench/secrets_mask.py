"""Benchmark: what the secrets mask costs on the hot paths (an event payload, a tool result).

    .venv/bin/python bench/secrets_mask.py [--secrets 0,1,20,100] [--samples 2000]

Prints one JSON line per number of known secrets: the median and p95 of mask_data() over a typical
event payload (8 short fields), and of mask() over a 16 KB tool result, plus one Fernet decrypt
(what injecting a secret costs once per run). No database is touched.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def timed(fn, samples: int) -> tuple[float, float]:
    runs = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    runs.sort()
    return statistics.median(runs) * 1e6, runs[int(len(runs) * 0.95)] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secrets", default="0,1,20,100")
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")
    os.environ.pop("DATABASE_URL", None)
    from cryptography.fernet import Fernet
    from django.conf import settings

    settings.configure() if not settings.configured else None
    from veronica.plumbing import secret_store

    key = Fernet.generate_key().decode()
    settings.SECRETS_KEYS = [key]
    payload = {"member_name": "w1", "tool": "run_command", "args": {"command": "ls -la src/"}, "seq": 41, "ok": True,
               "summary": "listed 24 entries in src/", "phase": "tool", "duration_ms": 12}
    result = ("line of ordinary tool output with paths src/app/main.py and numbers 12345\n" * 220)[:16384]
    ciphertext = secret_store.encrypt("a-secret-value-for-the-bench")
    decrypt_us, _ = timed(lambda: secret_store.decrypt(ciphertext), min(args.samples, 500))
    known = 0
    for target in (int(n) for n in args.secrets.split(",")):
        while known < target:
            secret_store.remember(f"K{known}", f"secret-value-{known:06d}-{'x' * 24}")
            known += 1
        event_med, event_p95 = timed(lambda: secret_store.mask_data(payload), args.samples)
        text_med, text_p95 = timed(lambda: secret_store.mask(result), args.samples)
        print(json.dumps({"bench": "secrets_mask", "known_secrets": known, "event_payload_us_median": round(event_med, 2),
                          "event_payload_us_p95": round(event_p95, 2), "tool_result_16k_us_median": round(text_med, 2),
                          "tool_result_16k_us_p95": round(text_p95, 2), "fernet_decrypt_us": round(decrypt_us, 2),
                          "load_average": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
