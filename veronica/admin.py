"""The operator's admin. Actions are thin: they call the same verbs as the console, API and tools."""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q
from django.utils.html import format_html

from veronica import ledger
from veronica import skills as skill_verbs
from veronica.engine import supervisor
from veronica.errors import VeronicaError
from veronica.markdown import render_markdown
from veronica.models import (
    Alarm, ApiToken, Approval, Blackboard, Event, McpServer, Member, Message, Run, Skill, Space, SpaceAccess, Task, UsageDay,
)


def _actor(request) -> str:
    return f"admin:{request.user.get_username()}"


def _run_verb(modeladmin, request, queryset, verb, label: str) -> None:
    done = 0
    for obj in queryset:
        try:
            verb(obj, actor=_actor(request))
            done += 1
        except VeronicaError as exc:
            modeladmin.message_user(request, f"{obj}: {exc.message}", messages.ERROR)
    if done:
        modeladmin.message_user(request, f"{label}: {done}", messages.SUCCESS)


class MemberInline(admin.TabularInline):
    model = Member
    fields = ("name", "role", "model", "membership", "run_status", "phase", "permission_mode", "schedule", "removed_at")
    readonly_fields = ("membership", "run_status", "phase", "removed_at")
    extra = 0
    show_change_link = True
    can_delete = False


class AccessInline(admin.TabularInline):
    model = SpaceAccess
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Space)
class SpaceAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "workdir", "member_count", "open_tasks", "event_seq")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("event_seq", "created_at")
    inlines = [MemberInline, AccessInline]
    actions = ["halt_all"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            _members=Count("members", filter=Q(members__removed_at__isnull=True), distinct=True),
            _open=Count("tasks", filter=Q(tasks__status__in=ledger.OPEN), distinct=True),
        )

    @admin.display(description="members", ordering="_members")
    def member_count(self, obj):
        return obj._members

    @admin.display(description="open tasks", ordering="_open")
    def open_tasks(self, obj):
        return obj._open

    @admin.action(description="Halt all members (suspend every member)")
    def halt_all(self, request, queryset):
        _run_verb(self, request, queryset, supervisor.halt_all, "halted spaces")


class MemberAdminForm(forms.ModelForm):
    class Meta:
        model = Member
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if self.instance.pk is None and data.get("space"):
            try:  # the same checks as the verb, shown as form errors
                supervisor.validate_new_member(data["space"], data.get("name", ""), role=data.get("role", ""),
                                               model=data.get("model", ""), permission_mode=data.get("permission_mode", ""),
                                               schedule=data.get("schedule", ""), rule_domains=data.get("rule_domains") or [],
                                               persona=data.get("persona", ""), when_to_use=data.get("when_to_use", ""),
                                               budget_override=data.get("budget_override"))
            except VeronicaError as exc:
                raise forms.ValidationError({exc.field if exc.field in self.fields else None: exc.message}) from None
        else:
            try:  # an edit writes the row directly: the checks a stored value must pass
                if data.get("schedule"):
                    data["schedule"] = supervisor.validate_cron(data["schedule"])
                data["rule_domains"] = supervisor.check_domains(data.get("rule_domains") or [])
                if data.get("budget_override") is not None:
                    supervisor.check_int(data["budget_override"], "budget_override")
            except VeronicaError as exc:
                raise forms.ValidationError({exc.field if exc.field in self.fields else None: exc.message}) from None
        return data


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
    form = MemberAdminForm
    list_display = ("name", "space", "role", "model", "membership", "run_status", "display_phase", "permission_mode", "schedule")
    list_filter = ("space", "role", "membership", "run_status", "permission_mode")
    list_select_related = ("space",)
    search_fields = ("name", "space__name")
    readonly_fields = ("run_status", "phase", "phase_tool", "phase_since", "lease_token", "lease_expires_at", "cancel_requested",
                       "membership", "removed_at", "spawned_from", "clone_seq", "schedule_origin", "schedule_set_at",
                       "schedule_tombstone", "schedule_next_at", "permission_origin", "created_at")
    actions = ["freeze", "unfreeze", "suspend", "resume"]

    def save_model(self, request, obj, form, change):
        if change:  # field edits (persona, model, schedule text...) apply at the next run boundary
            obj.reload_pending = True
            super().save_model(request, obj, form, change)
            return
        # a new member goes through the verb: name rules, one leader, the event
        created = supervisor.add_member(obj.space, obj.name, role=obj.role, persona=obj.persona, when_to_use=obj.when_to_use,
                                        model=obj.model, permission_mode=obj.permission_mode, schedule=obj.schedule,
                                        rule_domains=obj.rule_domains, budget_override=obj.budget_override, actor=_actor(request))
        obj.pk = created.pk

    @admin.action(description="Freeze selected members")
    def freeze(self, request, queryset):
        _run_verb(self, request, queryset, supervisor.freeze, "frozen")

    @admin.action(description="Unfreeze selected members")
    def unfreeze(self, request, queryset):
        _run_verb(self, request, queryset, supervisor.unfreeze, "unfrozen")

    @admin.action(description="Suspend selected members")
    def suspend(self, request, queryset):
        _run_verb(self, request, queryset, supervisor.suspend, "suspended")

    @admin.action(description="Resume selected members")
    def resume(self, request, queryset):
        _run_verb(self, request, queryset, supervisor.resume, "resumed")


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "space", "sender_name", "recipient_name", "subject", "short_body", "read_at", "created_at")
    list_filter = ("space", "recipient_name", "sender_name", ("read_at", admin.EmptyFieldListFilter))
    list_select_related = ("space",)
    search_fields = ("subject", "body")

    @admin.display(description="body")
    def short_body(self, obj):
        return obj.body[:80]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "space", "kind", "member", "created_at")
    list_filter = ("space", "kind")
    list_select_related = ("space", "member")
    search_fields = ("kind",)


@admin.register(Skill)
class SkillAdmin(admin.ModelAdmin):
    list_display = ("name", "space", "member", "scope", "updated_at")
    list_filter = ("space",)
    list_select_related = ("space", "member")
    readonly_fields = ("preview",)
    fields = ("space", "member", "name", "description", "body", "preview")

    @admin.display(description="rendered preview (sanitized)")
    def preview(self, obj):
        return format_html('<div class="skill-preview">{}</div>', render_markdown(obj.body)) if obj and obj.pk else "-"

    def save_model(self, request, obj, form, change):
        # Through the verb, so members reload at their next run and an event is emitted.
        try:
            skill = skill_verbs.add_skill(obj.space, obj.name, obj.body, member=obj.member, description=obj.description,
                                          overwrite=True, actor=_actor(request))
            obj.pk = skill.pk
        except VeronicaError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_model(self, request, obj):
        skill_verbs.remove_skill(obj.space, obj.name, member=obj.member, actor=_actor(request))


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "space", "status", "assignee", "creator_name", "engine_managed", "updated_at")
    list_filter = ("status", "space", "verify_policy", "engine_managed")
    list_select_related = ("space", "assignee")
    search_fields = ("title", "spec")
    readonly_fields = ("status", "started_at", "finished_at", "created_at", "updated_at")
    filter_horizontal = ("depends_on",)

    def save_related(self, request, form, formsets, change):
        if change:
            super().save_related(request, form, formsets, change)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        # a new task goes through the ledger: initial status from its dependencies, assignment mail
        task = ledger.create_task(obj.space, _actor(request), obj.title, spec=obj.spec, assignee=obj.assignee,
                                  depends_on=[t.pk for t in form.cleaned_data.get("depends_on", [])], not_before=obj.not_before,
                                  engine_managed=obj.engine_managed, verify_policy=obj.verify_policy)
        obj.pk = task.pk


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "space", "member", "tool_name", "status", "decided_by", "created_at")
    list_filter = ("status", "space")
    list_select_related = ("space", "member", "decided_by")


@admin.register(Blackboard)
class BlackboardAdmin(ReadOnlyAdmin):
    list_display = ("space", "updated_by", "updated_at")
    list_select_related = ("space",)


@admin.register(UsageDay)
class UsageDayAdmin(ReadOnlyAdmin):
    list_display = ("day", "space", "member", "input_tokens", "output_tokens", "usd", "runs", "tripped")
    list_filter = ("space", "day")
    list_select_related = ("space", "member")


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "member", "source", "outcome", "steps", "tokens", "started_at", "ended_at")
    list_filter = ("outcome", "source")
    list_select_related = ("member",)


@admin.register(Alarm)
class AlarmAdmin(admin.ModelAdmin):
    list_display = ("id", "space", "member", "fire_at", "fired_at", "created_by")
    list_select_related = ("space", "member")


@admin.register(SpaceAccess)
class SpaceAccessAdmin(admin.ModelAdmin):
    list_display = ("user", "space", "role")
    list_filter = ("role", "space")
    list_select_related = ("user", "space")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_select_related = ("user",)


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    """Env values may be secrets: the list and the form show the keys only (edit them in the manifest
    or remove and re-add the server in the console)."""

    list_display = ("name", "space", "member", "transport", "target", "timeout", "env_keys", "status")
    list_filter = ("space", "transport")
    fields = ("space", "member", "name", "transport", "command", "url", "env_keys", "timeout", "from_manifest",
              "last_error", "tools_cached", "checked_at")
    readonly_fields = ("env_keys", "from_manifest", "last_error", "tools_cached", "checked_at")

    @admin.display(description="env")
    def env_keys(self, obj) -> str:
        return ", ".join(sorted(obj.env or {})) or "-"

    @admin.display(description="status")
    def status(self, obj) -> str:
        return f"error: {obj.last_error[:120]}" if obj.last_error else ("ok" if obj.checked_at else "not started")
