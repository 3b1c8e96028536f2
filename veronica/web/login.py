"""The login form and the lockout page, for /login/ and /admin/login/ alike.

* The username's length is checked before anything authenticates: Django's AuthenticationForm
  does not enforce it, so a 1 MB username reached django-axes, whose failure record is a
  varchar(255) (PostgreSQL refused the write: a 500). Too long is now a form error.
* The lockout page (django-axes, HTTP 429) says when to come back: `Retry-After` in seconds.
  axes counts every attempt made while locked as a failure, which restarts the cool-off, so the
  answer is always the whole cool-off.
"""
from __future__ import annotations

import math

from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

USERNAME_MAX = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD).max_length or 150


def _clean_username(form: forms.Form) -> str:
    username = form.cleaned_data.get("username") or ""
    if len(username) > USERNAME_MAX:
        raise forms.ValidationError(f"A username has at most {USERNAME_MAX} characters.", code="max_length")
    return username


class LocalPasswordsOnly(forms.Form):
    """No password is even tried while local passwords are off (VERONICA_LOCAL_PASSWORDS=0)."""

    def clean(self):
        if not settings.LOCAL_PASSWORDS:
            raise forms.ValidationError("Passwords are switched off here; sign in with single sign-on.", code="local_passwords_off")
        return super().clean()


class LoginForm(LocalPasswordsOnly, AuthenticationForm):
    clean_username = _clean_username


class AdminLoginForm(LocalPasswordsOnly, AdminAuthenticationForm):
    clean_username = _clean_username


class LoginView(auth_views.LoginView):
    """Django's login page, with the single sign-on button when SSO is on and without the password
    form when local passwords are off."""

    redirect_authenticated_user = True
    authentication_form = LoginForm

    def get_context_data(self, **kwargs):
        from veronica.web import sso

        return {**super().get_context_data(**kwargs), "sso_enabled": sso.enabled(),
                "local_passwords": settings.LOCAL_PASSWORDS, "sso_failed": self.request.GET.get("sso") == "failed"}


def lockout_response(request: HttpRequest, original_response=None, credentials: dict | None = None) -> HttpResponse:
    """axes' lockout page (same template and context), with Retry-After."""
    username = get_client_username(request, credentials) or ""
    cool_off = get_cool_off(request)
    context = {"failure_limit": get_failure_limit(request, credentials), "username": username[:USERNAME_MAX],
               "cooloff_timedelta": cool_off}
    response = render(request, settings.AXES_LOCKOUT_TEMPLATE, context, status=settings.AXES_HTTP_RESPONSE_CODE)
    if cool_off:  # every attempt while locked counts as a failure and restarts the window: the whole of it is left
        response["Retry-After"] = str(math.ceil(cool_off.total_seconds()))
    return response
