import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from veronica.routing import websocket_urlpatterns  # noqa: E402
from veronica.stream_auth import OriginCheckedUnlessBearer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # cookie sockets need an allowed Origin (their CSRF check); bearer-token sockets do not
        "websocket": OriginCheckedUnlessBearer(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
