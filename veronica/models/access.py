from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class AccessRole(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    OWNER = "owner"


ROLE_RANK = {AccessRole.VIEWER: 1, AccessRole.OPERATOR: 2, AccessRole.OWNER: 3}


class SpaceAccess(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="space_access")
    space = models.ForeignKey("veronica.Space", on_delete=models.CASCADE, related_name="access")
    role = models.CharField(max_length=10, choices=AccessRole.choices, default=AccessRole.VIEWER)

    class Meta:
        verbose_name_plural = "space access"
        constraints = [
            models.UniqueConstraint(fields=["user", "space"], name="space_access_unique"),
            models.CheckConstraint(condition=Q(role__in=AccessRole.values), name="space_access_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} of {self.space}"

    def allows(self, needed: str) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[needed]


class ApiToken(models.Model):
    """A per-user token for scripts. Only its SHA-256 is stored; the key is shown once.

    It stops working when revoked, when it expires, when its user is disabled, and when its user's
    password changes (password_stamp is a digest of the password hash it was made under)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    read_only = models.BooleanField(default=False, help_text="Only GET (and the event stream); every change is refused.")
    password_stamp = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the user's password hash at creation.")

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class SsoIdentity(models.Model):
    """Who a person is at the organisation's OpenID Connect provider: once linked, a login with the
    same issuer and subject is this user whatever their e-mail or username becomes."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "SSO identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")]

    def __str__(self) -> str:
        return f"{self.user} at {self.issuer}"
