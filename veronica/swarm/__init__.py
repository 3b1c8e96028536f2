"""The swarm verbs: every action a person, a tool or the engine takes on a swarm, one function each.

Lives here: messages between members (bus, chat), the task ledger (ledger), the shared board (blackboard),
members' memory (memory), skills and MCP servers (skills, mcp_servers), the event log and its commit-time
broadcast (events), secrets (secrets), the audit trail (audit), the permission model (access), agent-to-agent
peers and calls (a2a_settings, a2a_calls, a2a_client), the bridge to the learning app (learning_bridge),
per-session usage (session_usage) and the day's meter and breaker (meter). Each verb validates, writes with a
conditional update and emits on commit.

May import: veronica.models, veronica.plumbing and — in the core layer with it — the engine, the agent runtime
and ops. Never the web edges nor portability: every door is a thin caller of these verbs.
"""
