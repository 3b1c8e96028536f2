"""The secrets API (owners): names and where they apply, a value only ever going in.

GET|POST /api/spaces/<slug>/secrets/          the space's secrets; POST {name, value, in_commands?}
GET|POST /api/spaces/<slug>/members/<name>/secrets/   one member's own
DELETE   .../secrets/<secret>/                remove one
"""
from __future__ import annotations

from django.http import HttpRequest

from veronica.swarm import access, secrets
from veronica.swarm.access import OWNER
from veronica.api.base import endpoint, json_body, text_field
from veronica.engine import supervisor
from veronica.plumbing.errors import VeronicaError


def _scope(request: HttpRequest, slug: str, name: str | None):
    space, _ = access.space_for(request.user, slug, OWNER)
    return space, supervisor.get_member(space, name) if name is not None else None


def _listing(request: HttpRequest, slug: str, name: str | None):
    space, member = _scope(request, slug, name)
    if request.method == "GET":
        rows = secrets.listing(space)
        return {"secrets": [r for r in rows if r["member"] == (member.name if member else None)]}
    data = json_body(request)
    in_commands = data.get("in_commands", False)
    if not isinstance(in_commands, bool):
        raise VeronicaError("in_commands must be true or false", field="in_commands")
    secret = secrets.set_secret(space, text_field(data, "name"), text_field(data, "value"), member=member,
                                in_commands=in_commands, actor=access.actor_name(request.user))
    return {"name": secret.name, "member": member.name if member else None, "in_commands": secret.in_commands}, 201


def _detail(request: HttpRequest, slug: str, name: str | None, secret: str) -> dict:
    space, member = _scope(request, slug, name)
    secrets.delete_secret(space, secret, member=member, actor=access.actor_name(request.user))
    return {"name": secret, "deleted": True}


@endpoint("GET", "POST")
def space_secrets(request: HttpRequest, slug: str):
    return _listing(request, slug, None)


@endpoint("GET", "POST")
def member_secrets(request: HttpRequest, slug: str, name: str):
    return _listing(request, slug, name)


@endpoint("DELETE")
def space_secret(request: HttpRequest, slug: str, secret: str) -> dict:
    return _detail(request, slug, None, secret)


@endpoint("DELETE")
def member_secret(request: HttpRequest, slug: str, name: str, secret: str) -> dict:
    return _detail(request, slug, name, secret)
