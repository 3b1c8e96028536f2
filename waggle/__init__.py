"""waggle: procedure memory for Veronica's agents.

Repeated read-only tool routes are recorded (``recorder``), mined (``miner``), stored as waggles
with a readable script (``route``, ``service.sweep``) and replayed when an agent starts walking one
again (``replay``, ``service.follow``); a lookup whose argument the message that woke the member
names is replayed before the model asks (``inbound``, ``service.inbound``); every reuse goes to a ledger and a curation pass keeps the
library tidy (``service.curate``). The host calls ``waggle.service``; waggle never imports it.
"""
