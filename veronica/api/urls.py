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
    path(S + "members/", views.members, name="members"),
    path(M, views.member_detail, name="member"),
    path(M + "transcript/", views.transcript, name="transcript"),
    path(M + "skills/", views.member_skills, name="member-skills"),
    path(M + "skills/<str:skill>/", cockpit.member_skill_detail, name="member-skill"),
    path(M + "memory/", views.member_memory, name="member-memory"),
    path(M + "memory/<str:file>/", views.member_memory_file, name="member-memory-file"),
    path(M + "schedule/", views.member_schedule, name="member-schedule"),
    path(M + "webhook/", views.webhook, name="member-webhook"),
    path(M + "<str:action>/", views.member_action, name="member-action"),
    path(S + "tasks/", views.tasks, name="tasks"),
    path(S + "tasks/<int:task_id>/", views.task_detail, name="task"),
    path(S + "tasks/<int:task_id>/<str:action>/", cockpit.task_act, name="task-action"),
    path(S + "skills/", cockpit.space_skills, name="skills"),
    path(S + "skills/<str:skill>/", cockpit.space_skill_detail, name="skill"),
    path(S + "messages/", views.messages, name="messages"),
    path(S + "events/", views.events, name="events"),
    path(S + "blackboard/", views.blackboard_view, name="blackboard"),
    path(S + "approvals/", views.approvals, name="approvals"),
    path(S + "approvals/<int:approval_id>/approve/", views.approval_decide, {"decision": "approve"}, name="approve"),
    path(S + "approvals/<int:approval_id>/deny/", views.approval_decide, {"decision": "deny"}, name="deny"),
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
