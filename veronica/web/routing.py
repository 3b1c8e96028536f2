from django.urls import path

from veronica.web.consumers import SpaceConsumer

websocket_urlpatterns = [
    path("ws/spaces/<slug:slug>/", SpaceConsumer.as_asgi()),
]
