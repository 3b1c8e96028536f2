from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from veronica.web import sso, views, views_a2a, views_audit, views_cockpit, views_improve, views_portable, views_secrets, views_steer
from veronica.web.login import AdminLoginForm, LoginView

admin.site.login_form = AdminLoginForm  # the username's length is checked before anything authenticates

console = ([
    path("", views.home, name="home"),
    path("tokens/", views.tokens_page, name="tokens"),
    path("new-space/", views_portable.new_space_page, name="new-space"),
    path("spaces/<slug:slug>/export/", views_portable.export_space, name="export"),
    path("audit/", views_audit.staff_audit, name="audit"),
    path("spaces/<slug:slug>/audit/", views_audit.space_audit, name="space-audit"),
    path("spaces/<slug:slug>/usage/", views_portable.usage_page, name="usage"),
    path("spaces/<slug:slug>/runs/<int:run_id>/", views_portable.run_page, name="run"),
    path("spaces/<slug:slug>/", views.space_page, name="space"),
    path("spaces/<slug:slug>/manage/", views.manage_page, name="manage"),
    path("spaces/<slug:slug>/secrets/", views_secrets.secrets_page, name="secrets"),
    path("spaces/<slug:slug>/rules/", views_improve.rules_page, name="rules"),
    path("spaces/<slug:slug>/waggles/", views_improve.waggles_page, name="waggles"),
    path("spaces/<slug:slug>/inbox/", views_improve.inbox_page, name="inbox"),
    path("spaces/<slug:slug>/panels/<str:panel>/", views.space_panel, name="space-panel"),
    path("spaces/<slug:slug>/tasks/<int:task_id>/", views.task_page, name="task"),
    path("spaces/<slug:slug>/tasks/new/", views_cockpit.task_new, name="task-new"),
    path("spaces/<slug:slug>/tasks/<int:task_id>/act/", views_cockpit.task_act, name="task-act"),
    path("spaces/<slug:slug>/new-member/", views_cockpit.member_new, name="member-new"),
    path("spaces/<slug:slug>/members/<str:name>/edit/", views_cockpit.member_edit, name="member-edit"),
    path("spaces/<slug:slug>/skills/", views_cockpit.skills_page, name="skills"),
    path("spaces/<slug:slug>/members/<str:name>/", views.member_page, name="member"),
    path("spaces/<slug:slug>/members/<str:name>/prompt/", views_steer.prompt_page, name="prompt"),
    path("spaces/<slug:slug>/members/<str:name>/panels/<str:panel>/", views.member_panel, name="member-panel"),
], "console")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", sso.Logout.as_view(), name="logout"),
    path("oidc/authenticate/", sso.LoginStart.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sso.Callback.as_view(), name="oidc_authentication_callback"),
    path("oidc/logout/", sso.Logout.as_view(), name="oidc_logout"),
    path("password/", views_audit.PasswordChange.as_view(), name="password_change"),
    path("password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("metrics", views.metrics, name="metrics"),
    path("api/", include("veronica.api.urls")),
    # A2A: a space (its leader) and the members its owner exposes, as agents (veronica.web.views_a2a)
    path("a2a/<slug:slug>/.well-known/agent-card.json", views_a2a.card, name="a2a-card"),
    path("a2a/<slug:slug>/.well-known/agent.json", views_a2a.card),  # the card's path before protocol 0.3
    path("a2a/<slug:slug>/", views_a2a.rpc, name="a2a-rpc"),
    path("a2a/<slug:slug>/<str:name>/.well-known/agent-card.json", views_a2a.card, name="a2a-member-card"),
    path("a2a/<slug:slug>/<str:name>/", views_a2a.rpc, name="a2a-member-rpc"),
    re_path(r"^api/(?P<rest>.*)$", views.api_not_found),
    re_path(r"^static/(?P<path>.*)$", views.static_file),
    path("favicon.ico", RedirectView.as_view(url="/static/favicon.svg", permanent=True)),  # pages without the <link> (admin)
    path("", include(console)),
]
