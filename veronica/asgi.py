import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "veronica.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from django.conf import settings  # noqa: E402

from veronica.plumbing.gcsettle import SettleOnFirstRequest, serving_with_daphne  # noqa: E402
from veronica.web.body_limit import BodyLimit, limit_daphne  # noqa: E402
from veronica.web.routing import websocket_urlpatterns  # noqa: E402
from veronica.web.stream_auth import OriginCheckedUnlessBearer  # noqa: E402

limit_daphne(settings.MAX_REQUEST_BYTES)  # daphne spools a body before it calls us: refuse it there

application = ProtocolTypeRouter(
    {
        # 413 before the body is spooled; the server's collector settles after its first request (gcsettle)
        "http": SettleOnFirstRequest(BodyLimit(django_asgi_app, settings.MAX_REQUEST_BYTES), serving_with_daphne()),
        # cookie sockets need an allowed Origin (their CSRF check); bearer-token sockets do not
        "websocket": OriginCheckedUnlessBearer(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
