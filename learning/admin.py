"""Admin: rules (user rules written through learning.people), the rule-review screen for proposals,
history with revert, and read-only views of reflections, ledgers, pass runs and the writer lease."""
from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from . import people, store
from .models import (
    MAX_ACTIVE_RULES_PER_DOMAIN,
    Domain,
    MinedItem,
    PassRun,
    Proposal,
    ProposalStatus,
    Reflection,
    Rule,
    RuleChange,
    RuleSource,
    WriterLease,
)
from .ops import GateError, diff_text


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- domains --------------------------------------------------------------------------------------

class DomainForm(forms.ModelForm):
    class Meta:
        model = Domain
        fields = ["name", "is_global", "owner", "note"]

    def clean_name(self):
        try:
            return store.clean_domain(self.cleaned_data.get("name", ""))
        except store.RuleInputError as exc:
            raise ValidationError(exc.message) from None

    def clean(self):
        data = super().clean()
        if data.get("is_global") and data.get("owner"):
            raise ValidationError({"owner": "a global domain has no owner: every space that routes global:<name> reads it"})
        return data


@admin.register(Domain)
class DomainAdmin(admin.ModelAdmin):
    """Staff make global domains here (shared on purpose), and give unowned ones an owner."""

    form = DomainForm
    list_display = ("label", "name", "kind", "owner", "rule_count", "created_at", "created_by")
    list_filter = ("is_global",)
    search_fields = ("name", "owner", "note")
    readonly_fields = ("created_at", "created_by")

    @admin.display(description="kind")
    def kind(self, obj):
        return "global (shared, staff-managed)" if obj.is_global else ("owned" if obj.owner else "unowned (staff only)")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_rules=Count("rules"))

    @admin.display(description="rules", ordering="n_rules")
    def rule_count(self, obj):
        return obj.n_rules

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user.get_username()[:150]
        super().save_model(request, obj, form, change)


# --- rules ----------------------------------------------------------------------------------------

class RuleForm(forms.ModelForm):
    class Meta:
        model = Rule
        fields = ["domain", "text", "enabled"]

    def clean_text(self):
        try:
            return store.clean_rule_text(self.cleaned_data.get("text", ""))
        except store.RuleInputError as exc:
            raise ValidationError(exc.message) from None

    def clean_enabled(self):
        """Enabling a learned rule keeps its domain within the active cap (the same check as the verb)."""
        enabled = self.cleaned_data.get("enabled")
        rule = self.instance
        if enabled and rule.pk and rule.source == RuleSource.LEARNED and not rule.enabled:
            before = store.learned_snapshot(rule.domain_id)
            try:
                store.check_cap(rule.domain, before, [dict(r, enabled=True) if r["id"] == rule.pk else r for r in before])
            except GateError as exc:
                raise ValidationError(str(exc)) from None
        return enabled


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    form = RuleForm
    list_display = ("ref", "domain", "source", "enabled", "strength", "short_text", "updated_at", "updated_by")
    list_filter = ("source", "enabled", "domain__is_global", "domain")
    list_select_related = ("domain",)
    search_fields = ("text", "domain__name", "domain__owner")
    ordering = ("domain", "source", "-strength", "id")

    @admin.display(description="rule")
    def ref(self, obj):
        return obj.ref

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text if len(obj.text) <= 120 else obj.text[:117] + "..."

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["domain", "text"]  # a person adds user rules; learned rules come from proposals
        if obj.source == RuleSource.USER:
            return ["domain", "source", "text", "created_by", "created_at", "updated_by", "updated_at"]
        return ["domain", "source", "text", "strength", "enabled", "created_by", "created_at", "updated_by", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        if obj.source == RuleSource.USER:
            return ["source", "created_by", "created_at", "updated_by", "updated_at"]
        return ["domain", "source", "text", "strength", "created_by", "created_at", "updated_by", "updated_at"]

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # a bulk delete would bypass history
        return actions

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.source == RuleSource.LEARNED:
            return False  # learned rules retire (disable) or are reverted, never deleted by hand
        return super().has_delete_permission(request, obj)

    def save_model(self, request, obj, form, change):
        if not change:
            rule = people.add_user_rule(form.cleaned_data["domain"], form.cleaned_data["text"], actor=request.user)
            obj.pk = obj.id = rule.pk
            obj.source = rule.source
        elif obj.source == RuleSource.USER:
            people.edit_user_rule(obj.pk, form.cleaned_data["text"], actor=request.user,
                                  domain=form.cleaned_data["domain"])
        elif "enabled" in form.changed_data:
            people.set_learned_enabled(obj.pk, obj.enabled, actor=request.user)

    def delete_model(self, request, obj):
        if obj.source != RuleSource.USER:
            raise PermissionDenied("learned rules are not deleted by hand")
        people.remove_user_rule(obj.pk, actor=request.user)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


# --- proposals and the review screen ----------------------------------------------------------------

@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    list_display = ("id", "domain", "status", "op_count", "created_at", "decided_by", "decided_at", "review_link")
    list_filter = ("status", "domain__is_global", "domain")
    list_select_related = ("domain",)
    change_list_template = "admin/learning/proposal/change_list.html"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="ops")
    def op_count(self, obj):
        return len(obj.ops or [])

    @admin.display(description="")
    def review_link(self, obj):
        url = reverse("admin:learning_proposal_change", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, "review" if obj.status == ProposalStatus.PENDING else "view")

    def get_urls(self):
        urls = super().get_urls()
        extra = [
            path("review/", self.admin_site.admin_view(self.review_view), name="learning_proposal_review"),
            path("<int:proposal_id>/decide/", self.admin_site.admin_view(self.decide_view),
                 name="learning_proposal_decide"),
        ]
        return extra + urls

    def _entries(self, proposals):
        entries = []
        for p in proposals:
            current = store.learned_snapshot(p.domain_id)
            entry = {
                "proposal": p,
                "ops_json": json.dumps([{**op, "rule": f"L{op['rule']}"} if "rule" in op else op for op in p.ops],
                                       indent=1, ensure_ascii=False),
                "reflections": list(p.reflections.all()[:50]),
                "active_now": sum(1 for r in current if r["enabled"]),
                "user_rules": store.user_snapshot(p.domain_id),
            }
            if p.status == ProposalStatus.PENDING:
                entry.update(people.preview(p))
            else:
                entry.update({"diff": p.diff, "stale": False, "error": "", "active_after": None})
                entry["change"] = p.changes.order_by("id").first()
            entry["diff_text"] = diff_text(entry["diff"])
            entries.append(entry)
        return entries

    def review_view(self, request, object_id=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        if object_id is not None:
            if not str(object_id).isdigit():
                raise Http404("no such proposal")
            proposals = [get_object_or_404(Proposal, pk=int(object_id))]
            title = f"Review proposal #{object_id}"
        else:
            proposals = list(Proposal.objects.filter(status=ProposalStatus.PENDING).select_related("domain").order_by("id"))
            title = "Rule review"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "entries": self._entries(proposals),
            "single": object_id is not None,
            "can_decide": self.has_change_permission(request),
            "max_active": MAX_ACTIVE_RULES_PER_DOMAIN,
        }
        return TemplateResponse(request, "admin/learning/review.html", context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return self.review_view(request, object_id=object_id)

    def decide_view(self, request, proposal_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        action = request.POST.get("action")
        back = request.POST.get("next") or ""
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            back = reverse("admin:learning_proposal_review")
        try:
            if action == "approve":
                edited = None
                raw = request.POST.get("ops", "").strip()
                if raw:
                    try:
                        edited = json.loads(raw)
                    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
                        raise people.ReviewError(f"the edited operations are not valid JSON: {str(exc)[:200]}") from None
                change = people.approve_proposal(proposal_id, actor=request.user, edited_ops=edited)
                messages.success(request, f"Proposal #{proposal_id} approved (change #{change.pk}).")
            elif action == "reject":
                people.reject_proposal(proposal_id, actor=request.user, reason=request.POST.get("reason", ""))
                messages.success(request, f"Proposal #{proposal_id} rejected.")
            else:
                messages.error(request, f"Unknown action {action!r}.")
        except people.ReviewError as exc:
            messages.error(request, str(exc))
        return HttpResponseRedirect(back)


# --- history -------------------------------------------------------------------------------------

@admin.register(RuleChange)
class RuleChangeAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "actor", "domain", "source", "action", "summary", "reverted")
    list_filter = ("source", "action", "domain")
    list_select_related = ("domain",)
    search_fields = ("actor", "summary", "domain__name", "domain__owner")
    change_form_template = "admin/learning/rulechange/change_form.html"
    fields = ("created_at", "actor", "domain", "source", "action", "summary", "proposal", "reverts")
    readonly_fields = fields

    @admin.display(boolean=True)
    def reverted(self, obj):
        return obj.reverted_by.exists()

    def get_urls(self):
        return [
            path("<int:change_id>/revert/", self.admin_site.admin_view(self.revert_view),
                 name="learning_rulechange_revert"),
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if obj is not None:
            extra.update({
                "diff": obj.diff,
                "diff_text": diff_text(obj.diff),
                "reverted_by": obj.reverted_by.order_by("id").first(),
                "can_revert": request.user.has_perm("learning.change_rule"),
            })
        return super().change_view(request, object_id, form_url, extra)

    def revert_view(self, request, change_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm("learning.change_rule"):
            raise PermissionDenied
        try:
            change = people.revert_change(change_id, actor=request.user)
            messages.success(request, f"Change #{change_id} reverted (change #{change.pk}).")
        except (people.ReviewError, store.RuleInputError) as exc:
            messages.error(request, str(exc))
        return HttpResponseRedirect(reverse("admin:learning_rulechange_change", args=[change_id]))


# --- read-only bookkeeping ---------------------------------------------------------------------------

@admin.register(Reflection)
class ReflectionAdmin(ReadOnlyAdmin):
    list_display = ("id", "domain", "kind", "item_key", "short_text", "consumed_at", "proposal")
    list_filter = ("domain", "kind")
    list_select_related = ("domain",)
    search_fields = ("text", "item_key")

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:120]


@admin.register(MinedItem)
class MinedItemAdmin(ReadOnlyAdmin):
    list_display = ("kind", "key", "created_at", "pass_run")
    list_filter = ("kind",)
    search_fields = ("key",)


@admin.register(PassRun)
class PassRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "status", "started_at", "finished_at", "stats")
    list_filter = ("kind", "status")


@admin.register(WriterLease)
class WriterLeaseAdmin(ReadOnlyAdmin):
    list_display = ("name", "holder_label", "acquired_at", "expires_at")
