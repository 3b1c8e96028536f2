from django.urls import path

from veronica.api import cockpit, views

app_name = "api"

S = "spaces/<slug:slug>/"
M = S + "members/<str:name>/"

urlpatterns = [
    path("", views.index, name="index"),
    path("me/", views.me, name="me"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/", views.token_detail, name="token"),
    path("spaces/", views.spaces, name="spaces"),
    path(S, views.space_detail, name="space"),
    path(S + "usage/", views.usage, name="usage"),
    path(S + "halt/", views.halt, name="halt"),
    path(S + "resume/", cockpit.resume_all, name="resume-all"),
    path(S + "name/", cockpit.space_name, name="space-name"),
    path(S + "budget/", cockpit.space_budget, name="space-budget"),
    path(S + "members/", views.members, name="members"),
    path(M, views.member_detail, name="member"),
    path(M + "transcript/", views.transcript, name="transcript"),
    path(M + "skills/", views.member_skills, name="member-skills"),
    path(M + "memory/", views.member_memory, name="member-memory"),
    path(M + "memory/<str:file>/", views.member_memory_file, name="member-memory-file"),
    path(M + "schedule/", views.member_schedule, name="member-schedule"),
    path(M + "webhook/", views.webhook, name="member-webhook"),
    path(M + "chat/", cockpit.member_chat, name="member-chat"),
    path(M + "budget/", cockpit.member_budget, name="member-budget"),
    path(M + "prompt/", cockpit.member_prompt, name="member-prompt"),
    path(M + "budget/reset/", cockpit.member_budget_reset, name="member-budget-reset"),
    path(M + "<str:action>/", views.member_action, name="member-action"),
    path(S + "tasks/", views.tasks, name="tasks"),
    path(S + "tasks/<int:task_id>/", views.task_detail, name="task"),
    path(S + "messages/", views.messages, name="messages"),
    path(S + "events/", views.events, name="events"),
    path(S + "blackboard/", views.blackboard_view, name="blackboard"),
    path(S + "approvals/", views.approvals, name="approvals"),
    path(S + "approvals/<int:approval_id>/approve/", views.approval_decide, {"decision": "approve"}, name="approve"),
    path(S + "approvals/<int:approval_id>/deny/", views.approval_decide, {"decision": "deny"}, name="deny"),
    path(S + "approval-rules/", cockpit.approval_rules, name="approval-rules"),
    path(S + "approval-rules/<int:rule_id>/", cockpit.approval_rule, name="approval-rule"),
    path(S + "questions/", views.questions, name="questions"),
    path(S + "questions/<int:question_id>/answer/", views.question_answer, name="answer"),
    path(S + "webhook/", views.webhook, name="webhook"),
    path(S + "webhook/secret/", views.webhook_secret, name="webhook-secret"),
    path(S + "retention/", views.retention_view, name="retention"),
    path(S + "access/", views.space_access, name="access"),
    path(S + "notify/", views.space_notify, name="notify"),
    path(S + "notify/test/", views.space_notify_test, name="notify-test"),
    path(S + "checks/", views.space_checks, name="checks"),
    path(S + "watchdogs/", views.space_watchdogs, name="watchdogs"),
    path(S + "access/<str:username>/", views.space_access_detail, name="access-user"),
]
