"""Benchmark: building the rules prompt block at run start.

    .venv/bin/python bench/rules_bench.py [--domains 4] [--learned 25] [--user 5] [--warm 2000]

Sets Django up against a throwaway SQLite database under data/ (removed afterwards; DATABASE_URL
is ignored so the bench never touches a real database), fills N domains with learned and user
rules, and times learning.api.prompt_block(domains):

* first call   the first call in a fresh process (opens the DB connection, cold cache);
* cold         cache cleared before each call (stamp query + rules query + render), median;
* warm         cached (one single-row stamp query + dict lookup), median and p95;
* after write  the first call after an approval changed the rule set (cache invalidated).
"""
from __future__ import annotations

import argparse
import statistics
import time

from throwaway import throwaway_django


def fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:8.1f} µs" if us < 1000 else f"{us / 1000:8.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", type=int, default=4)
    parser.add_argument("--learned", type=int, default=25, help="active learned rules per domain")
    parser.add_argument("--user", type=int, default=5, help="user rules per domain")
    parser.add_argument("--cold", type=int, default=200, help="cold samples")
    parser.add_argument("--warm", type=int, default=2000, help="warm samples")
    args = parser.parse_args()

    with throwaway_django("rules-bench-") as tmp:
        from django.db import connection

        from learning import api, store
        from learning.models import Proposal

        domains = [f"domain{i}" for i in range(args.domains)]
        for d in domains:
            for j in range(args.user):
                api.add_user_rule(d, f"User rule {j} of {d}: keep the operator informed about step {j}.", actor="bench")
            for start in range(0, args.learned, 12):
                n = min(12, args.learned - start)
                store.apply_ops(d, [{"op": "add", "text": f"Learned rule {start + k} of {d}: a lesson of typical "
                                     f"length, about one sentence, learned from review {start + k}."}
                                    for k in range(n)], actor="bench", max_active=max(25, args.learned))
        connection.close()  # the next call is a run start in a fresh process: it opens the connection
        store.clear_cache()

        t0 = time.perf_counter()
        block = api.prompt_block(domains)
        first = time.perf_counter() - t0

        cold = []
        for _ in range(args.cold):
            store.clear_cache()
            t0 = time.perf_counter()
            api.prompt_block(domains)
            cold.append(time.perf_counter() - t0)

        api.prompt_block(domains)
        warm = []
        for _ in range(args.warm):
            t0 = time.perf_counter()
            api.prompt_block(domains)
            warm.append(time.perf_counter() - t0)
        warm.sort()

        rule = store.learned_snapshot(domains[0])[0]
        proposal = Proposal.objects.create(domain=store.as_domain(domains[0]), ops=[{"op": "edit", "rule": rule["id"], "text": "Edited by an approval."}],
                                           base=store.learned_snapshot(domains[0]))
        api.approve_proposal(proposal.pk, actor="bench")
        t0 = time.perf_counter()
        fresh = api.prompt_block(domains)
        after_write = time.perf_counter() - t0
        assert "Edited by an approval." in fresh, "stale block after an approval"

        n_rules = args.domains * (args.learned + args.user)
        print(f"prompt block: {args.domains} domains x ({args.learned} learned + {args.user} user) = {n_rules} rules, "
              f"{len(block)} chars (~{len(block) // 4} tokens), {connection.vendor} at {tmp}")
        print(f"  first call in process : {fmt(first)}  (opens the DB connection)")
        print(f"  cold (cache cleared)  : {fmt(statistics.median(cold))}  median of {len(cold)}")
        print(f"  warm (cached)         : {fmt(statistics.median(warm))}  median of {len(warm)}, "
              f"p95 {fmt(warm[int(len(warm) * 0.95)]).strip()}")
        print(f"  first after approval  : {fmt(after_write)}  (stamp changed: rebuilt, not stale)")


if __name__ == "__main__":
    main()
