"""The engine: what runs members and keeps the swarm moving without anyone asking.

Lives here: the run slot and its fenced lease (slot, leases), wakes and the django-q2 wake task (wakes,
runner, qbroker, fleet, warm), the tick and its duties (tick, ticker, drive, cron, timers, alarms,
watchdogs, retention, outage), the supervisor verbs (supervisor, failures, approvals, and roster: the ones the
leader's tools call too), budgets (budget: the owner's verbs; the meter itself is veronica.swarm.meter) and
verify checks (checks, check_queue). Task paths queued by string ("veronica.engine.runner.wake", ...) live
here and must not move.

May import: the agent runtime, the swarm verbs and ops (one core layer with it), veronica.models and
veronica.plumbing. Never the web edges nor portability. The agent never imports runner, tick or drive.
"""
