"""The agent runtime: one member's run, from prompt to tool calls to the reply.

Lives here: the run loop (loop), the run context (runctx), the prompt (prompt), providers (providers/),
tools (tools/, and the waggle bridge), compaction, the transcript, metering, live text and the MCP client.

May import: the engine's verbs the tools call (alarms, approvals, clock, roster — never runner, tick, drive,
supervisor or budget: those import the agent), the swarm verbs and ops (one core layer), veronica.models and
veronica.plumbing, and the waggle and learning apps.
"""
