"""Admin: the waggle library (per space and global) with reuse stats, readable route and script,
enable / disable actions; the ledger and the forage log are read-only."""
from __future__ import annotations

import json

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.html import format_html

from waggle.models import ForageCall, LedgerEntry, Waggle
from waggle.route import Route, RouteFormatError


def _ledger_of_waggle():
    return LedgerEntry.objects.filter(scope=OuterRef("scope"), store_key=OuterRef("space_key"),
                                      name=OuterRef("name")).order_by().values("name")


def annotate_stats(qs):
    """uses / fails / estimated tokens saved per waggle as correlated subqueries (no N+1)."""
    uses = _ledger_of_waggle().filter(fail=False).annotate(n=Count("id")).values("n")
    fails = _ledger_of_waggle().filter(fail=True).annotate(n=Count("id")).values("n")
    saved = _ledger_of_waggle().filter(fail=False).annotate(n=Sum("yield_tokens")).values("n")
    return qs.annotate(
        n_uses=Coalesce(Subquery(uses, output_field=IntegerField()), Value(0)),
        n_fails=Coalesce(Subquery(fails, output_field=IntegerField()), Value(0)),
        est_saved=Coalesce(Subquery(saved, output_field=IntegerField()), Value(0)),
    )


class SpaceFilter(admin.SimpleListFilter):
    title = "library"
    parameter_name = "library"

    def lookups(self, request, model_admin):
        keys = (Waggle.objects.filter(scope=Waggle.SCOPE_SPACE).order_by("space_key")
                .values_list("space_key", flat=True).distinct())
        return [("__global__", "global")] + [(k, f"space {k}") for k in keys]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value == "__global__":
            return queryset.filter(scope=Waggle.SCOPE_GLOBAL)
        return queryset.filter(scope=Waggle.SCOPE_SPACE, space_key=value)


@admin.register(Waggle)
class WaggleAdmin(admin.ModelAdmin):
    list_display = ("name", "scope", "space_key", "length", "uses", "est_tokens_saved", "fails", "disabled",
                    "created")
    list_filter = (SpaceFilter, "scope", "disabled")
    search_fields = ("name", "space_key", "script")
    actions = ("enable", "disable")
    readonly_fields = ("name", "scope", "space_key", "length", "mined_count", "created", "touched", "stats",
                       "readable_route", "readable_script")
    fields = ("name", "scope", "space_key", "disabled", "stats", "readable_script", "readable_route", "length",
              "mined_count", "created", "touched")

    def get_queryset(self, request):
        return annotate_stats(super().get_queryset(request))

    def has_add_permission(self, request):
        return False  # waggles are mined, not written by hand

    def save_model(self, request, obj, form, change):
        if change and "disabled" in form.changed_data:
            obj.touched = timezone.now()  # a fresh enable/disable restarts the prune clock
        super().save_model(request, obj, form, change)

    @admin.display(ordering="n_uses", description="uses")
    def uses(self, obj):
        return obj.n_uses

    @admin.display(ordering="n_fails", description="fails")
    def fails(self, obj):
        return obj.n_fails

    @admin.display(ordering="est_saved", description="tokens saved (estimate)")
    def est_tokens_saved(self, obj):
        return obj.est_saved

    @admin.display(description="stats")
    def stats(self, obj):
        return (f"{getattr(obj, 'n_uses', 0)} uses, {getattr(obj, 'n_fails', 0)} failures, "
                f"~{getattr(obj, 'est_saved', 0)} tokens saved (estimate)")

    @admin.display(description="route")
    def readable_route(self, obj):
        try:
            route = Route.from_json(obj.route, name=obj.name, scope=obj.scope)
            text = "\n".join(f"{i}. {s.describe()}" for i, s in enumerate(route.steps, 1))
        except RouteFormatError as exc:
            text = f"(unreadable route: {exc})"
        raw = json.dumps(obj.route, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html("<pre>{}</pre><details><summary>JSON</summary><pre>{}</pre></details>", text, raw)

    @admin.display(description="script")
    def readable_script(self, obj):
        return format_html("<pre>{}</pre>", obj.script or "(no script)")

    @admin.action(description="Enable selected waggles")
    def enable(self, request, queryset):
        n = queryset.filter(disabled=True).update(disabled=False, touched=timezone.now())
        self.message_user(request, f"{n} waggle(s) enabled.", messages.SUCCESS)

    @admin.action(description="Disable selected waggles")
    def disable(self, request, queryset):
        n = queryset.filter(disabled=False).update(disabled=True, touched=timezone.now())
        self.message_user(request, f"{n} waggle(s) disabled.", messages.SUCCESS)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("created", "name", "scope", "space_key", "steps", "yield_tokens", "fail", "on_demand")
    list_filter = ("scope", "fail", "on_demand")
    search_fields = ("name", "space_key", "session_key")
    date_hierarchy = "created"


@admin.register(ForageCall)
class ForageCallAdmin(ReadOnlyAdmin):
    list_display = ("created", "space_key", "session_key", "seq", "tool", "mutates", "replayed", "est_tokens")
    list_filter = ("mutates", "replayed")
    search_fields = ("space_key", "session_key", "tool")
