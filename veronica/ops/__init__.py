"""Operations: what tells people and machines how the swarm is doing.

Lives here: alerts to operators by mail and webhook (notify), the one guarded HTTP client every outbound call
uses (outbound), signed outgoing webhooks (webhooks), the Prometheus metrics and their per-member families
(metrics, metrics_members), and OpenTelemetry tracing (tracing).

May import: veronica.models, veronica.plumbing, and — in the core layer with them — the engine, the agent
runtime and the swarm verbs (notify records its deliveries as events). Never the web edges nor portability.
"""
