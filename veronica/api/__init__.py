"""The JSON API under /api/: session or bearer-token auth, JSON errors naming the field."""
