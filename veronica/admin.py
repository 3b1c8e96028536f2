"""The operator's admin. Actions are thin: they call the same verbs as the console, API and tools."""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.html import format_html

from veronica import ledger, mcp_servers, memory, notify, webhooks
from veronica import skills as skill_verbs
from veronica.engine import checks, retention, supervisor
from veronica.errors import VeronicaError
from veronica.markdown import render_markdown
from veronica.models import (
    Alarm, ApiToken, Approval, Blackboard, DeliveryStatus, Event, McpServer, Member, MemoryFile, Message, NotificationDelivery, Run,
    Skill, Space, SpaceAccess, Task, TaskCheck, UsageDay, WebhookDelivery,
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


class SpaceAdminForm(forms.ModelForm):
    """The notifier and checks go through the verbs' validators (http/https only, named checks)."""

    class Meta:
        model = Space
        fields = "__all__"

    def _verb_clean(self, name: str, clean):
        try:
            return clean(self.cleaned_data.get(name))
        except VeronicaError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_verify_checks(self):
        return self._verb_clean("verify_checks", checks.clean_spec)

    def clean_notify_webhook_url(self):
        return self._verb_clean("notify_webhook_url", lambda v: notify.clean_url(v, "notify_webhook_url"))

    def clean_notify_slack_url(self):
        return self._verb_clean("notify_slack_url", lambda v: notify.clean_url(v, "notify_slack_url"))

    def clean_notify_emails(self):
        return self._verb_clean("notify_emails", lambda v: notify.clean_emails(v, "notify_emails"))


@admin.register(Space)
class SpaceAdmin(admin.ModelAdmin):
    form = SpaceAdminForm
    list_display = ("name", "slug", "workdir", "member_count", "open_tasks", "event_seq")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    # the secret is never shown again after it is made: set or rotate it with the action
    exclude = ("webhook_secret", "webhook_rotated_at")
    readonly_fields = ("event_seq", "created_at", "webhook_secret_masked", "webhook_rotated_at")
    inlines = [MemberInline, AccessInline]
    actions = ["halt_all", "send_test_notification", "rotate_webhook_secret", "preview_retention", "purge_retention"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "verify_checks" in form.changed_data:  # through the checks verb, like the console and the API (its event too)
            checks.configure(obj, form.cleaned_data["verify_checks"], actor=_actor(request))

    @admin.display(description="webhook secret")
    def webhook_secret_masked(self, obj):
        return webhooks.masked(obj) if obj and obj.pk else "-"

    @admin.action(description="Rotate the webhook secret (shown once)")
    def rotate_webhook_secret(self, request, queryset):
        for space in queryset:
            secret = webhooks.rotate_secret(space, actor=_actor(request))
            self.message_user(request, f"{space.slug}: new webhook secret {secret} (copy it now; it is never shown again)",
                              messages.WARNING)

    @admin.action(description="Preview the retention purge (dry run)")
    def preview_retention(self, request, queryset):
        for space in queryset:
            self.message_user(request, f"{space.slug}: {_purge_line(retention.purge_space(space, dry_run=True), space)} would go")

    @admin.action(description="Purge now per retention")
    def purge_retention(self, request, queryset):
        for space in queryset:
            self.message_user(request, f"{space.slug}: removed {_purge_line(retention.purge_space(space), space)}", messages.SUCCESS)

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

    @admin.action(description="Send a test notification through the space's notifier")
    def send_test_notification(self, request, queryset):
        _run_verb(self, request, queryset, notify.send_test, "test notifications queued")


def _purge_line(counts: dict[str, int], space: Space) -> str:
    if not counts:
        return "nothing (retention is off: retention_days = 0)"
    return ", ".join(f"{n} {kind}" for kind, n in counts.items()) + f" (older than {space.retention_days} days)"


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
                       "schedule_tombstone", "schedule_next_at", "permission_origin", "origin", "removed_by", "created_at",
                       # engine state (the failure model, the watchdogs): shown, never edited by hand
                       "failures", "retry_at", "error_reason", "parked_config", "stuck_alerted_at", "backlog_alerted_at")
    actions = ["freeze", "unfreeze", "suspend", "resume"]

    def get_readonly_fields(self, request, obj=None):
        # a rename would bypass the name rules (reserved engine names) and orphan mail addressed by name
        return (*self.readonly_fields, "name", "space") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:  # field edits (persona, model...) apply at the next run boundary: the prompt is built per run
            super().save_model(request, obj, form, change)
            self._schedule_through_verb(request, obj, form)
            return
        # a new member goes through the verb: name rules, one leader, the event
        created = supervisor.add_member(obj.space, obj.name, role=obj.role, persona=obj.persona, when_to_use=obj.when_to_use,
                                        model=obj.model, permission_mode=obj.permission_mode, schedule=obj.schedule,
                                        rule_domains=obj.rule_domains, budget_override=obj.budget_override, actor=_actor(request))
        obj.pk = created.pk

    def _schedule_through_verb(self, request, obj, form) -> None:
        """A schedule edit arms the next firing and records the origin, like the API and the tool."""
        if "schedule" not in form.changed_data:
            return
        if obj.schedule:
            supervisor.set_schedule(obj, obj.schedule, actor=_actor(request))
        else:
            supervisor.clear_schedule(obj, actor=_actor(request))

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


class TaskCheckInline(admin.TabularInline):
    model = TaskCheck
    fields = ("attempt", "name", "passed", "exit_code", "timed_out", "duration_ms", "output", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class TaskAdminForm(forms.ModelForm):
    class Meta:
        model = Task
        fields = "__all__"

    def clean(self):
        data = super().clean()
        space = data.get("space")
        if self.instance.pk is None and data.get("verify_policy") == "checks" and space is not None and not space.verify_checks:
            raise forms.ValidationError({"verify_policy": "this space configures no verify_checks; a checks task would wait forever"})
        return data


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    form = TaskAdminForm

    def get_inlines(self, request, obj):
        return [TaskCheckInline] if obj is not None else []  # evidence exists only for a saved task
    list_display = ("id", "title", "space", "status", "assignee", "creator_name", "engine_managed", "updated_at")
    list_filter = ("status", "space", "verify_policy", "engine_managed")
    list_select_related = ("space", "assignee")
    search_fields = ("title", "spec")
    readonly_fields = ("status", "started_at", "finished_at", "created_at", "updated_at", "check_evidence", "check_claimed_at")
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


class MemoryFileAdminForm(forms.ModelForm):
    class Meta:
        model = MemoryFile
        fields = ("member", "name", "content")

    def clean(self):
        data = super().clean()
        if data.get("member") and data.get("name"):
            try:
                memory.check(data["member"], data["name"], data.get("content") or "")
            except VeronicaError as exc:
                raise forms.ValidationError({exc.field if exc.field in ("name", "content") else "__all__": exc.message}) from None
        return data


@admin.register(MemoryFile)
class MemoryFileAdmin(admin.ModelAdmin):
    form = MemoryFileAdminForm
    list_display = ("name", "member", "space_name", "size", "updated_at")
    list_filter = ("member__space",)
    list_select_related = ("member__space",)
    search_fields = ("name", "content", "member__name")
    readonly_fields = ("preview",)

    @admin.display(description="space")
    def space_name(self, obj):
        return obj.member.space.slug

    @admin.display(description="characters")
    def size(self, obj):
        return len(obj.content)

    @admin.display(description="rendered preview (sanitized)")
    def preview(self, obj):
        return format_html('<div class="memory-preview">{}</div>', render_markdown(obj.content)) if obj and obj.pk else "-"

    def save_model(self, request, obj, form, change):
        # through the verb (caps, name rules, the event the member page listens for)
        if change and "name" in form.changed_data:
            memory.delete(obj.member, form.initial["name"], actor=_actor(request))
        row = memory.write(obj.member, obj.name, obj.content, actor=_actor(request))
        obj.pk, obj.name = row.pk, row.name

    def delete_model(self, request, obj):
        memory.delete(obj.member, obj.name, actor=_actor(request))


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "space", "member_name")
    list_filter = ("space",)
    list_select_related = ("space",)


@admin.register(TaskCheck)
class TaskCheckAdmin(ReadOnlyAdmin):
    list_display = ("id", "task", "space", "attempt", "name", "passed", "exit_code", "timed_out", "duration_ms", "created_at")
    list_filter = ("passed", "timed_out", "space")
    list_select_related = ("task", "space")


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "space", "seq", "channel", "subject", "status", "attempts", "next_at", "sent_at", "last_error")
    list_filter = ("status", "channel", "space")
    list_select_related = ("space",)
    actions = ["retry_now"]

    @admin.action(description="Retry now (failed or pending deliveries)")
    def retry_now(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        NotificationDelivery.objects.filter(pk__in=ids).update(status=DeliveryStatus.PENDING, next_at=timezone.now())
        result = notify.deliver(ids)
        self.message_user(request, f"sent {result['sent']}, failed {result['failed']}", messages.SUCCESS)


class McpServerForm(forms.ModelForm):
    """The admin checks a server as the console and the manifest do (veronica.mcp_servers.check): a
    NUL in the command failed the save on PostgreSQL, and a bad name or a command that is not a list
    was stored and failed later, at every run of the member."""

    class Meta:
        model = McpServer
        fields = "__all__"

    def clean(self):
        data = super().clean()
        cfg = {"name": data.get("name")}
        if data.get("transport") == "http":
            cfg["url"] = data.get("url") or ""
        else:
            cfg["command"] = data.get("command")
        if data.get("timeout") is not None:
            cfg["timeout"] = data["timeout"]
        try:
            mcp_servers.check(cfg)
        except VeronicaError as exc:
            tail = (exc.field or "").rsplit(".", 1)[-1]
            self.add_error(tail if tail in ("name", "command", "url", "timeout") else None, exc.message)
        return data


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    """Env values may be secrets: the list and the form show the keys only (edit them in the manifest
    or remove and re-add the server in the console)."""

    form = McpServerForm
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
