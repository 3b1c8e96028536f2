"""Plumbing: small helpers with no knowledge of the product.

Lives here: the RETURNING insert helpers (returning), the event streams' doorbells (doorbell for embedded,
redisbell for hosted), environment parsing for settings (env), the error type every door turns into a 400
(errors), sanitized markdown (markdown), the secrets mask and cipher (secret_store), the client-IP and
private-header middleware (web_headers), and what /proc says of a process (procstat).

May import: the standard library and third-party packages only — never veronica.models nor any other veronica
package (the bottom layer of the .importlinter layers contract).
"""
