"""The web edges: every door a person or a peer comes in by over HTTP or a socket.

Lives here: the console pages (views, views_cockpit, views_steer, views_improve, views_portable, views_secrets,
views_audit, views_a2a), the JSON API (veronica.api, its own package), the event socket and its routing and
auth (consumers, routing, stream_auth), sign-in and SSO (login, sso), the request-size guard (body_limit), the
run trace and prompt inspector pages' readers (run_trace, prompt_inspector), and the A2A server (a2a_serve).

May import: everything below it — portability, the core (engine, agent runtime, swarm verbs, ops),
veronica.models and veronica.plumbing. Nothing imports the web edges but urls, asgi and settings.
Each door is a thin caller: parse, check access, call one verb, render.
"""
