"""The agent runtime: one member's run, from prompt to tool calls to the reply.

Lives here: the run loop (loop), the run context (runctx), the prompt (prompt), providers (providers/),
tools (tools/, and the waggle bridge), compaction, the transcript, metering, live text and the MCP client.

May import: the engine's verbs below the run (budget, slot, supervisor — never runner, tick or drive), the
swarm verbs and ops (one core layer), veronica.models and veronica.plumbing, and the waggle and learning apps.
"""
