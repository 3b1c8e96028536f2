"""The operator's admin. Actions are thin: they call the same verbs as the console, API and tools.

One file past 500 lines on purpose: Django loads `veronica.admin` by name, and it is one thin
ModelAdmin per model (forms that call a verb, read-only fields where none exists), read one at a
time; a package would split nothing that belongs together.
"""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import IntegrityError, transaction
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html

from veronica.swarm import access, blackboard, ledger, mcp_servers, memory, secrets
from veronica.ops import notify, webhooks
from veronica.swarm import skills as skill_verbs
from veronica.engine import alarms, checks, retention, supervisor, watchdogs
from veronica.api import selectors as sel
from veronica.plumbing.errors import VeronicaError
from veronica.plumbing.markdown import render_markdown
from veronica.models import (
    Alarm, ApiToken, Approval, AuditRow, Blackboard, DeliveryStatus, Event, McpServer, Member, MemoryFile, Message, NotificationDelivery, Run,
    Secret, Skill, Space, SpaceAccess, SsoIdentity, Task, TaskCheck, UsageDay, WebhookDelivery,
)


def _actor(request) -> str:
    return f"admin:{request.user.get_username()}"


def _form_error(form: forms.ModelForm, exc: VeronicaError, fallback: str | None = None) -> None:
    """A verb's refusal as a form error on the field it names (or the form, when it names none shown)."""
    field = exc.field if exc.field in form.fields else fallback
    form.add_error(field if field in form.fields else None, exc.message)


class VerbAdmin(admin.ModelAdmin):
    """Saves go through verbs, whose checks the forms run first. Should a verb still refuse at save time
    (a race: a leader added meanwhile), the save rolls back and the form comes back with the reason,
    never a 500."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except (VeronicaError, IntegrityError) as exc:
            self.message_user(request, getattr(exc, "message", None) or f"refused by the database: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except VeronicaError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


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
    """Shown, never edited here: a member's edits go through its own page (the verbs)."""
    model = Member
    fields = ("name", "role", "model", "membership", "run_status", "phase", "permission_mode", "schedule", "removed_at")
    readonly_fields = fields
    extra = 0
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class AccessInline(admin.TabularInline):
    """Saved through access.grant / access.revoke (SpaceAdmin.save_formset), like the console's access page."""
    model = SpaceAccess
    extra = 0
    autocomplete_fields = ("user",)

    def get_readonly_fields(self, request, obj=None):
        return ()


# Space settings that have a verb; on a saved space every other field is shown read-only.
WATCHDOG_FIELDS = watchdogs.THRESHOLDS
NOTIFY_FIELDS = ("notify_webhook_url", "notify_slack_url", "notify_emails")
SPACE_VERB_FIELDS = ("retention_days", *WATCHDOG_FIELDS, "verify_checks", *NOTIFY_FIELDS, "blackboard_cap")


class SpaceAdminForm(forms.ModelForm):
    """Settings go through the verbs' validators, so a bad value is a field error naming the limit."""

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

    def clean_blackboard_cap(self):
        return self._verb_clean("blackboard_cap", blackboard.clean_cap)

    def clean_notify_webhook_url(self):
        return self._verb_clean("notify_webhook_url", lambda v: notify.clean_url(v, "notify_webhook_url"))

    def clean_notify_slack_url(self):
        return self._verb_clean("notify_slack_url", lambda v: notify.clean_url(v, "notify_slack_url"))

    def clean_notify_emails(self):
        return self._verb_clean("notify_emails", lambda v: notify.clean_emails(v, "notify_emails"))

    def clean_retention_days(self):
        return self._verb_clean("retention_days", retention.clean_days)

    def clean(self):
        data = super().clean()
        given = {k: data[k] for k in WATCHDOG_FIELDS if k in self.changed_data and data.get(k) is not None}
        try:
            watchdogs.clean_thresholds(given)
        except VeronicaError as exc:
            _form_error(self, exc)
        return data


@admin.register(Space)
class SpaceAdmin(VerbAdmin):
    form = SpaceAdminForm
    list_display = ("name", "slug", "workdir", "member_count", "open_tasks", "event_seq")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    # the secret is never shown again after it is made: set or rotate it with the action
    exclude = ("webhook_secret", "webhook_rotated_at")
    # where a space's files live is the server's decision (its own folder), never a form's
    readonly_fields = ("workdir", "event_seq", "created_at", "webhook_secret_masked", "webhook_rotated_at")
    inlines = [MemberInline, AccessInline]
    actions = ["halt_all", "send_test_notification", "rotate_webhook_secret", "preview_retention", "purge_retention"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.readonly_fields
        # no verb edits these on a saved space (the manifest and register own them): shown, not edited
        others = [f.name for f in Space._meta.concrete_fields if f.editable and f.name not in SPACE_VERB_FIELDS
                  and f.name not in ("id", *self.exclude)]
        return (*self.readonly_fields, *others)

    def get_prepopulated_fields(self, request, obj=None):
        return self.prepopulated_fields if obj is None else {}

    def save_model(self, request, obj, form, change):
        if not change:  # no verb creates a bare space (register and the console's templates do more)
            if not obj.workdir:  # a space added here works in its own folder, like one made on New space
                from veronica.portable.archive import home_of

                workdir = home_of(obj.slug) / "workspace"
                workdir.mkdir(parents=True, exist_ok=True)
                obj.workdir = str(workdir)
            super().save_model(request, obj, form, change)
            return
        self._settings_through_verbs(request, Space.objects.get(pk=obj.pk), form)
        obj.refresh_from_db()

    def _settings_through_verbs(self, request, space: Space, form) -> None:
        """Each changed group through the verb the console and the API call (its checks, its event)."""
        changed, data, actor = set(form.changed_data), form.cleaned_data, _actor(request)
        if "retention_days" in changed:
            retention.set_retention_days(space, data["retention_days"], actor=actor)
        if "blackboard_cap" in changed:
            blackboard.set_cap(space, data["blackboard_cap"], actor=actor)
        if changed & set(WATCHDOG_FIELDS):
            watchdogs.set_thresholds(space, {k: data[k] for k in WATCHDOG_FIELDS if k in changed}, actor=actor)
        if "verify_checks" in changed:
            checks.configure(space, data["verify_checks"], actor=actor)
        if changed & set(NOTIFY_FIELDS):
            notify.configure(space, webhook_url=data["notify_webhook_url"], slack_url=data["notify_slack_url"],
                             emails=data["notify_emails"], actor=actor)

    def save_formset(self, request, form, formset, change):
        if formset.model is not SpaceAccess:
            return super().save_formset(request, form, formset, change)
        space, actor = form.instance, _actor(request)
        for row in formset.deleted_forms:
            if row.instance.pk:
                access.revoke(space, row.instance.user.get_username(), actor=actor)
        for row in formset.forms:
            if row in formset.deleted_forms or not row.has_changed() or not row.cleaned_data.get("user"):
                continue
            if row.instance.pk and "user" in row.changed_data:  # a row moved to another user: the old one loses access
                access.revoke(space, SpaceAccess.objects.get(pk=row.instance.pk).user.get_username(), actor=actor)
            access.grant(space, row.cleaned_data["user"].get_username(), row.cleaned_data["role"], actor=actor)
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []  # the history entry's lists

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
        # a subquery per count, the open tasks counted up to a cap: joining members and tasks counted their product
        # (50 members x 20,000 open tasks: 3.5 s for the list)
        return super().get_queryset(request).annotate(
            _members=sel.count_per_space(Member.objects.filter(removed_at__isnull=True)), _open=sel.open_tasks_per_space())

    @admin.display(description="members", ordering="_members")
    def member_count(self, obj):
        return obj._members

    @admin.display(description="open tasks", ordering="_open")
    def open_tasks(self, obj):
        return f"{sel.OPEN_TASKS_CAP:,}+" if obj._open > sel.OPEN_TASKS_CAP else obj._open

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


# What the add form asks (add_member's parameters) and what a saved member's form edits (a verb each).
MEMBER_ADD_FIELDS = ("space", "name", "role", "persona", "when_to_use", "model", "permission_mode", "schedule",
                     "rule_domains", "budget_override")
MEMBER_EDIT_FIELDS = supervisor.EDITABLE


class MemberAdminForm(forms.ModelForm):
    class Meta:
        model = Member
        fields = "__all__"

    def clean(self):
        data = super().clean()
        try:
            if self.instance.pk is None:
                if data.get("space"):  # the same checks as the verb, shown as form errors
                    supervisor.validate_new_member(
                        data["space"], data.get("name", ""), role=data.get("role", ""), model=data.get("model", ""),
                        permission_mode=data.get("permission_mode", ""), schedule=data.get("schedule", ""),
                        rule_domains=data.get("rule_domains") or [], persona=data.get("persona", ""),
                        when_to_use=data.get("when_to_use", ""), budget_override=data.get("budget_override"))
            else:
                self._clean_edit(data)
        except VeronicaError as exc:
            _form_error(self, exc)
        return data

    def _clean_edit(self, data: dict) -> None:
        edits = {k: data[k] for k in supervisor.EDITABLE if k in self.changed_data and k in data}
        if "rule_domains" in edits:
            edits["rule_domains"] = edits["rule_domains"] or []
        data.update(supervisor.clean_member_edit(self.instance, edits))

    def _post_clean(self):
        # a saved member's row is written by the verbs only: no model validation of stale engine state,
        # and the constraints (one leader, unique name) were checked above with the verbs' messages
        if self.instance.pk is None:
            super()._post_clean()


@admin.register(Member)
class MemberAdmin(VerbAdmin):
    form = MemberAdminForm
    list_display = ("name", "space", "role", "model", "membership", "run_status", "display_phase", "permission_mode", "schedule")
    list_filter = ("space", "role", "membership", "run_status", "permission_mode")
    list_select_related = ("space",)
    search_fields = ("name", "space__name")
    actions = ["freeze", "unfreeze", "suspend", "resume", "remove"]

    def get_fields(self, request, obj=None):
        if obj is None:
            return MEMBER_ADD_FIELDS
        return [f.name for f in Member._meta.concrete_fields if f.name != "id"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        # engine state, identity and provenance: shown, never edited by hand (no verb writes them from here)
        return [f.name for f in Member._meta.concrete_fields if f.name not in (*MEMBER_EDIT_FIELDS, "id")]

    def has_delete_permission(self, request, obj=None):
        return False  # a member is removed (kept for its history) with the "remove" action: supervisor.remove_member

    def save_model(self, request, obj, form, change):
        if change:
            self._edit_through_verbs(request, Member.objects.get(pk=obj.pk), form)
            obj.refresh_from_db()
            return
        # a new member goes through the verb: name rules, one leader, the event
        created = supervisor.add_member(obj.space, obj.name, role=obj.role, persona=obj.persona, when_to_use=obj.when_to_use,
                                        model=obj.model, permission_mode=obj.permission_mode, schedule=obj.schedule,
                                        rule_domains=obj.rule_domains, budget_override=obj.budget_override, actor=_actor(request))
        obj.pk = created.pk

    def _edit_through_verbs(self, request, member: Member, form) -> None:
        """The changed fields through supervisor.edit_member, the verb the console and the API call: the
        same row, runtime origin and events (schedule and permission mode through their own verbs)."""
        edits = {k: form.cleaned_data[k] for k in supervisor.EDITABLE if k in form.changed_data}
        if edits:
            supervisor.edit_member(member, edits, actor=_actor(request))

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

    @admin.action(description="Remove selected members (kept with their history)")
    def remove(self, request, queryset):
        _run_verb(self, request, queryset.filter(removed_at__isnull=True), supervisor.remove_member, "removed")


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


@admin.register(AuditRow)
class AuditRowAdmin(ReadOnlyAdmin):
    """Read-only: audit rows are never changed or deleted by the app (the retention duty purges)."""
    list_display = ("created_at", "space_slug", "actor", "via", "ip", "action", "target")
    list_filter = ("via", "action")
    search_fields = ("actor", "action", "target", "space_slug")
    date_hierarchy = "created_at"


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "space", "kind", "member", "created_at")
    list_filter = ("space", "kind")
    list_select_related = ("space", "member")
    search_fields = ("kind",)


class SkillAdminForm(forms.ModelForm):
    class Meta:
        model = Skill
        fields = ("space", "member", "name", "description", "body")

    def clean(self):
        data = super().clean()
        space = data.get("space", self.instance.space if self.instance.pk else None)
        member = data.get("member", self.instance.member if self.instance.pk else None)
        try:
            name, data["body"], data["description"] = skill_verbs.clean_skill(data.get("name", ""), data.get("body", ""),
                                                                              data.get("description", ""))
        except VeronicaError as exc:
            _form_error(self, exc)
            return data
        data["name"] = name
        if member is not None and space is not None and member.space_id != space.pk:
            self.add_error("member", f"{member.name} is not a member of {space.slug}")
        elif space is not None and (self.instance.pk is None or name != self.instance.name) and \
                Skill.objects.filter(space=space, member=member, name=name).exists():
            self.add_error("name", f"a skill named '{name}' already exists here")
        return data


@admin.register(Skill)
class SkillAdmin(VerbAdmin):
    form = SkillAdminForm
    list_display = ("name", "space", "member", "scope", "updated_at")
    list_filter = ("space",)
    list_select_related = ("space", "member")
    fields = ("space", "member", "name", "description", "body", "preview")

    def get_readonly_fields(self, request, obj=None):
        # the scope is the skill's identity: move one by adding it there and removing it here
        return ("preview",) if obj is None else ("space", "member", "preview")

    @admin.display(description="rendered preview (sanitized)")
    def preview(self, obj):
        return format_html('<div class="skill-preview">{}</div>', render_markdown(obj.body)) if obj and obj.pk else "-"

    def save_model(self, request, obj, form, change):
        """Through the verbs, so members reload at their next run and an event is emitted; a rename
        is the old name removed and the new one added, in one transaction."""
        if change and not form.has_changed():
            return
        actor = _actor(request)
        with transaction.atomic():
            if change and "name" in form.changed_data:
                skill_verbs.remove_skill(obj.space, form.initial["name"], member=obj.member, actor=actor)
            skill = skill_verbs.add_skill(obj.space, obj.name, obj.body, member=obj.member, description=obj.description,
                                          overwrite=change and "name" not in form.changed_data, actor=actor)
        obj.pk = skill.pk

    def delete_model(self, request, obj):
        skill_verbs.remove_skill(obj.space, obj.name, member=obj.member, actor=_actor(request))

    def delete_queryset(self, request, queryset):
        """The bulk "delete selected" action: one remove_skill (and its skill.removed) per skill."""
        for skill in queryset.select_related("space", "member"):
            skill_verbs.remove_skill(skill.space, skill.name, member=skill.member, actor=_actor(request))


class TaskCheckInline(admin.TabularInline):
    model = TaskCheck
    fields = ("attempt", "name", "passed", "exit_code", "timed_out", "duration_ms", "output", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


TASK_ADD_FIELDS = ("space", "title", "spec", "assignee", "depends_on", "not_before", "engine_managed", "verify_policy")


class TaskAdminForm(forms.ModelForm):
    class Meta:
        model = Task
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if self.instance.pk is None:
            space = data.get("space")
            if data.get("verify_policy") == "checks" and space is not None and not space.verify_checks:
                self.add_error("verify_policy", "this space configures no verify_checks; a checks task would wait forever")
            return data
        if "assignee" in self.changed_data:  # the ledger's assign checks, as field errors
            if data.get("assignee") is None:
                self.add_error("assignee", "a task cannot be unassigned; assign it to another member")
            else:
                try:
                    ledger.check_assign(self.instance, data["assignee"])
                except VeronicaError as exc:
                    _form_error(self, exc, fallback="assignee")
        return data

    def _post_clean(self):
        if self.instance.pk is None:  # a saved task is written by the ledger only
            super()._post_clean()


@admin.register(Task)
class TaskAdmin(VerbAdmin):
    form = TaskAdminForm
    list_display = ("id", "title", "space", "status", "assignee", "creator_name", "engine_managed", "updated_at")
    list_filter = ("status", "space", "verify_policy", "engine_managed")
    list_select_related = ("space", "assignee")
    search_fields = ("title", "spec")
    filter_horizontal = ("depends_on",)

    def get_inlines(self, request, obj):
        return [TaskCheckInline] if obj is not None else []  # evidence exists only for a saved task

    def get_fields(self, request, obj=None):
        if obj is None:
            return TASK_ADD_FIELDS
        return [f.name for f in (*Task._meta.concrete_fields, *Task._meta.many_to_many) if f.name != "id"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        # the ledger moves a task; only the assignee has a verb here (ledger.assign: a ready task starts)
        return [name for name in self.get_fields(request, obj) if name != "assignee"]

    actions = ["cancel_tasks", "retry_tasks"]

    def has_delete_permission(self, request, obj=None):
        return False  # no verb deletes a task (cancel it; retention purges closed ones)

    @admin.action(description="Cancel selected tasks (their assignees are told)")
    def cancel_tasks(self, request, queryset):
        _run_verb(self, request, queryset.select_related("assignee", "space"), ledger.cancel, "cancelled")

    @admin.action(description="Retry selected failed tasks (started again with their assignee)")
    def retry_tasks(self, request, queryset):
        _run_verb(self, request, queryset.select_related("assignee", "space"), ledger.retry, "retried")

    def save_related(self, request, form, formsets, change):
        if change:
            super().save_related(request, form, formsets, change)

    def save_model(self, request, obj, form, change):
        if change:
            if "assignee" in form.changed_data:  # mail and dispatch exactly as the ledger's assign does
                task = Task.objects.select_related("assignee", "space").get(pk=obj.pk)
                ledger.assign(task, form.cleaned_data["assignee"], actor=_actor(request))
            obj.refresh_from_db()
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


class AlarmAdminForm(forms.ModelForm):
    class Meta:
        model = Alarm
        fields = ("member", "fire_at", "note")


@admin.register(Alarm)
class AlarmAdmin(VerbAdmin):
    """Set through alarms.set_alarm (its django-q schedule and event); a set alarm is shown, not edited."""
    form = AlarmAdminForm
    list_display = ("id", "space", "member", "fire_at", "fired_at", "created_by")
    list_select_related = ("space", "member")

    def get_fields(self, request, obj=None):
        return AlarmAdminForm.Meta.fields if obj is None else ("space", "member", "fire_at", "note", "created_by", "fired_at",
                                                               "created_at")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.get_fields(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False  # no verb cancels an alarm

    def save_model(self, request, obj, form, change):
        if not change:
            obj.pk = alarms.set_alarm(obj.member, obj.fire_at, obj.note, created_by=_actor(request)[:60]).pk


@admin.register(SpaceAccess)
class SpaceAccessAdmin(VerbAdmin):
    """Granted and revoked through access.grant / access.revoke, like the console's access page."""
    list_display = ("user", "space", "role")
    list_filter = ("role", "space")
    list_select_related = ("user", "space")

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else ("user", "space")

    def save_model(self, request, obj, form, change):
        if form.has_changed():
            obj.pk = access.grant(obj.space, obj.user.get_username(), obj.role, actor=_actor(request)).pk

    def delete_model(self, request, obj):
        access.revoke(obj.space, obj.user.get_username(), actor=_actor(request))

    def delete_queryset(self, request, queryset):
        _run_verb(self, request, queryset.select_related("space", "user"),
                  lambda row, actor: access.revoke(row.space, row.user.get_username(), actor=actor), "revoked")


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
        member = data.get("member") or (self.instance.member if self.instance.pk else None)  # read-only once saved
        if member and data.get("name"):
            try:
                memory.check(member, data["name"], data.get("content") or "")
            except VeronicaError as exc:
                raise forms.ValidationError({exc.field if exc.field in ("name", "content") else "__all__": exc.message}) from None
        return data


@admin.register(MemoryFile)
class MemoryFileAdmin(VerbAdmin):
    form = MemoryFileAdminForm
    list_display = ("name", "member", "space_name", "size", "updated_at")
    list_filter = ("member__space",)
    list_select_related = ("member__space",)
    search_fields = ("name", "content", "member__name")
    readonly_fields = ("preview",)

    def get_readonly_fields(self, request, obj=None):
        return ("preview",) if obj is None else ("member", "preview")  # a file belongs to one member

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
        if change and not form.has_changed():
            return
        if change and "name" in form.changed_data:
            memory.delete(obj.member, form.initial["name"], actor=_actor(request))
        row = memory.write(obj.member, obj.name, obj.content, actor=_actor(request))
        obj.pk, obj.name = row.pk, row.name

    def delete_model(self, request, obj):
        memory.delete(obj.member, obj.name, actor=_actor(request))

    def delete_queryset(self, request, queryset):
        for row in queryset.select_related("member"):
            memory.delete(row.member, row.name, actor=_actor(request))


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
    """The admin checks a server as the console and the manifest do (veronica.swarm.mcp_servers.check): a
    NUL in the command failed the save on PostgreSQL, and a bad name or a command that is not a list
    was stored and failed later, at every run of the member."""

    class Meta:
        model = McpServer
        fields = "__all__"

    def clean(self):
        data = super().clean()
        if self.instance.pk is not None:  # a declared server is read-only here
            return data
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
        space, member = data.get("space"), data.get("member")
        if space is not None and member is not None and member.space_id != space.pk:
            self.add_error("member", f"{member.name} is not a member of {space.slug}")
        elif space is not None and McpServer.objects.filter(space=space, member=member, name=data.get("name")).exists():
            self.add_error("name", f"an MCP server named '{data.get('name')}' is already declared here")
        return data


@admin.register(McpServer)
class McpServerAdmin(VerbAdmin):
    """Env values may be secrets: the list and the form show the keys only (edit them in the manifest
    or remove and re-add the server in the console). Added and removed through veronica.swarm.mcp_servers;
    a declared server is shown read-only (no verb edits one in place)."""

    form = McpServerForm
    list_display = ("name", "space", "member", "transport", "target", "timeout", "env_keys", "status")
    list_filter = ("space", "transport")
    fields = ("space", "member", "name", "transport", "command", "url", "env_keys", "timeout", "from_manifest",
              "last_error", "tools_cached", "checked_at")
    readonly_fields = ("env_keys", "from_manifest", "last_error", "tools_cached", "checked_at")

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is None else self.fields

    def save_model(self, request, obj, form, change):
        if not change:
            cfg = mcp_servers.check({"name": obj.name, "timeout": obj.timeout,
                                     **({"url": obj.url} if obj.transport == "http" else {"command": obj.command})})
            obj.pk = mcp_servers.add(obj.space, cfg, member=obj.member, actor=_actor(request)).pk

    def delete_model(self, request, obj):
        mcp_servers.remove(obj.space, obj.name, member=obj.member, actor=_actor(request))

    def delete_queryset(self, request, queryset):
        for server in queryset.select_related("space", "member"):
            mcp_servers.remove(server.space, server.name, member=server.member, actor=_actor(request))

    @admin.display(description="env")
    def env_keys(self, obj) -> str:
        return ", ".join(sorted(obj.env or {})) or "-"

    @admin.display(description="status")
    def status(self, obj) -> str:
        return f"error: {obj.last_error[:120]}" if obj.last_error else ("ok" if obj.checked_at else "not started")


@admin.register(Secret)
class SecretAdmin(ReadOnlyAdmin):
    """Names and where they apply; the value (even encrypted) is never shown. Set one on the space's
    secrets page or through the API; removing one here goes through the verb (an event)."""

    list_display = ("name", "space", "member", "in_commands", "created_at", "updated_at", "rotated_at")
    list_filter = ("space", "in_commands")
    list_select_related = ("space", "member")
    search_fields = ("name",)
    fields = ("name", "space", "member", "in_commands", "created_at", "updated_at", "rotated_at")
    readonly_fields = fields

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("veronica.delete_secret")

    def delete_model(self, request, obj):
        secrets.delete_secret(obj.space, obj.name, member=obj.member, actor=_actor(request))

    def delete_queryset(self, request, queryset):
        for secret in queryset.select_related("space", "member"):
            secrets.delete_secret(secret.space, secret.name, member=secret.member, actor=_actor(request))


@admin.register(SsoIdentity)
class SsoIdentityAdmin(ReadOnlyAdmin):
    list_display = ("user", "issuer", "subject", "created_at", "last_login_at")
    search_fields = ("user__username", "subject")
    list_select_related = ("user",)
