"""Console pages for portable spaces (create, export) and the run trace / usage pages."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_http_methods

from veronica.web import run_trace
from veronica.swarm import access
from veronica.portable import archive as portable
from veronica.swarm.access import OWNER
from veronica.web.views import _context, form_error, refuse_unstorable
from veronica.plumbing.errors import VeronicaError, column_limit
from veronica.models import Space

# --- create a space -------------------------------------------------------------------------------------


def _refuse_oversized(request: HttpRequest) -> None:
    """Before anything reads request.POST: parsing it would spool the whole upload to disk."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > portable.MAX_ARCHIVE_BYTES + 65536:
        raise VeronicaError(f"the upload is {declared} bytes; an archive may be at most {portable.MAX_ARCHIVE_BYTES}",
                            field="archive")


def _upload(request: HttpRequest) -> bytes:
    upload = request.FILES.get("archive")
    if upload is None:
        raise VeronicaError("choose a template or upload a manifest archive (.tar.gz)", field="archive")
    if upload.size > portable.MAX_ARCHIVE_BYTES:
        raise VeronicaError(f"archive is {upload.size} bytes; the limit is {portable.MAX_ARCHIVE_BYTES}", field="archive")
    return upload.read(portable.MAX_ARCHIVE_BYTES + 1)


@csrf_exempt  # only so the size check runs before the CSRF middleware parses the body; checked below
@login_required
@require_http_methods(["GET", "POST"])
def new_space_page(request: HttpRequest) -> HttpResponse:
    """Staff, or users with veronica.add_space, create a space and become its owner."""
    if not portable.may_create(request.user):
        raise PermissionDenied("creating spaces needs staff or the 'add space' permission")
    if request.method == "POST":
        try:
            _refuse_oversized(request)
        except VeronicaError as exc:
            return _new_space_form(request, form_error(request, exc))
    return _new_space(request)


@csrf_protect
def _new_space(request: HttpRequest) -> HttpResponse:
    status = 200
    if request.method == "POST":
        try:
            refuse_unstorable(request.POST)
            slug, actor = request.POST.get("slug", "").strip(), access.actor_name(request.user)
            name = request.POST.get("name", "").strip() or None  # blank: the manifest's name
            if request.POST.get("source") == "archive":
                space = portable.create_from_archive(_upload(request), slug, name=name, user=request.user, actor=actor)
            else:
                space = portable.create_from_template(request.POST.get("template", ""), slug, name=name,
                                                      user=request.user, actor=actor)
            messages.success(request, f"created space {space.slug}; you are its owner")
            return redirect("console:space", slug=space.slug)
        except VeronicaError as exc:
            status = form_error(request, exc)
    return _new_space_form(request, status)


def _new_space_form(request: HttpRequest, status: int) -> HttpResponse:
    return render(request, "console/new_space.html", {"templates": list(portable.templates()), "page": "new-space",
                                                      "max_bytes": portable.MAX_ARCHIVE_BYTES,
                                                      "name_limit": column_limit(Space, "name")}, status=status)


@login_required
def export_space(request: HttpRequest, slug: str) -> HttpResponse:
    space, _ = access.space_for(request.user, slug, OWNER)
    response = HttpResponse(portable.export_archive(space), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="{portable.archive_name(space)}"'
    response["Cache-Control"] = "no-store"
    return response


# --- run trace and usage -----------------------------------------------------------------------------------

@login_required
def run_page(request: HttpRequest, slug: str, run_id: int) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    run = run_trace.run_in_space(space, run_id)
    return render(request, "console/run.html", _context(space, role, trace=run_trace.trace(run), page="run"))


@login_required
def usage_page(request: HttpRequest, slug: str) -> HttpResponse:
    space, role = access.space_for(request.user, slug)
    return render(request, "console/usage.html", _context(space, role, usage=run_trace.usage(space), page="usage"))


