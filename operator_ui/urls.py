from django.contrib.auth import views as auth_views
from django.urls import path

from . import (
    approval_views,
    log_views,
    pairing_views,
    session_list_views,
    session_settings_views,
    system_views,
    usage_views,
    views,
)

app_name = "ui"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.login, name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="ui:login"), name="logout"),
    path("sessions/", session_list_views.sessions_list, name="sessions"),
    path("sessions/new", views.session_new, name="session-new"),
    path("sessions/bulk/archive", session_list_views.sessions_archive, name="sessions-archive"),
    path("sessions/bulk/reset", session_list_views.sessions_reset, name="sessions-reset"),
    path("sessions/<path:key>/send", views.session_send, name="session-send"),
    path("sessions/<path:key>/abort", views.session_abort, name="session-abort"),
    path("sessions/<path:key>/dispatch", views.session_dispatch, name="session-dispatch"),
    path("sessions/<path:key>/move-to-gateway", views.session_move_to_gateway, name="session-move-to-gateway"),
    path("sessions/<path:key>/reclaim", views.session_reclaim, name="session-reclaim"),
    path("sessions/<path:key>/fork", views.session_fork, name="session-fork"),
    path("sessions/<path:key>/patch", session_settings_views.session_patch, name="session-patch"),
    path("sessions/<path:key>/reset", session_settings_views.session_reset, name="session-reset"),
    path("sessions/<path:key>/delete", session_settings_views.session_delete, name="session-delete"),
    path("sessions/<path:key>/images/<str:entry_id>/<int:index>", views.session_image, name="session-image"),
    path("sessions/<path:key>/", views.session_detail, name="session"),
    path("artifacts/<str:artifact_id>/", views.artifact, name="artifact"),
    path("approvals/", approval_views.approvals, name="approvals"),
    # Any approval id (an RPC caller may choose one with a slash in it); the decision is the last segment.
    path("approvals/<path:approval_id>/<str:decision>", approval_views.approval_decide, name="approval-decide"),
    path("runs/", views.runs_list, name="runs"),
    path("logs/", log_views.logs_page, name="logs"),
    path("logs/tail", log_views.logs_follow, name="logs-follow"),
    path("environments/", views.environments, name="environments"),
    path("nodes/", views.nodes, name="nodes"),
    path("usage/", usage_views.usage, name="usage"),
    path(
        "nodes/requests/<str:request_id>/<str:decision>",
        views.node_request_decide,
        name="node-request",
    ),
    path("nodes/<str:node_id>/remove", views.node_remove, name="node-remove"),
    path("system/", system_views.system, name="system"),
    path("pairing/", pairing_views.pairing, name="pairing"),
    path(
        "pairing/requests/<str:request_id>/<str:decision>",
        pairing_views.pairing_request_decide,
        name="pairing-request",
    ),
    path("pairing/devices/<str:device_id>/remove", pairing_views.pairing_device_remove, name="pairing-device-remove"),
    path(
        "pairing/devices/<str:device_id>/tokens/<str:role>/revoke",
        pairing_views.pairing_token_revoke,
        name="pairing-token-revoke",
    ),
    path(
        "pairing/devices/<str:device_id>/tokens/<str:role>/rotate",
        pairing_views.pairing_token_rotate,
        name="pairing-token-rotate",
    ),
]
