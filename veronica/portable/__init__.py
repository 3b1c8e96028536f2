"""Portability: a swarm as text, in and out.

Lives here: the swarm manifest (TOML) and what applies it (manifest), the archive export/import and templates
(archive), the TOML writer (toml_out), the startup applier that builds the swarm a deployment declares
(startup), and the demo seed (seed).

May import: the core (engine, agent runtime, swarm verbs, ops), veronica.models and veronica.plumbing. Never
the web edges — the pages, API and commands call in here, not the reverse.
"""
