"""API tokens from the command line: the same verbs as the tokens page and POST /api/tokens/."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from veronica.swarm import access, audit
from veronica.plumbing.errors import VeronicaError


class Command(BaseCommand):
    help = ("Create, list or revoke a user's API tokens. `token create USER NAME [--days N] [--read-only]` prints the "
            "key once (only its hash is stored); a token ends when revoked, expired, its user disabled or its "
            "user's password changed.")

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="make a token and print its key once")
        create.add_argument("username")
        create.add_argument("name", help=f"what the token is for (at most {access.TOKEN_NAME_MAX} characters)")
        create.add_argument("--days", help=f"expire after this many days (1-{access.TOKEN_MAX_DAYS}); default never")
        create.add_argument("--read-only", action="store_true", help="GET only: every change is refused with 403")
        listing = actions.add_parser("list", help="the user's tokens")
        listing.add_argument("username")
        revoke = actions.add_parser("revoke", help="revoke one of the user's tokens by id")
        revoke.add_argument("username")
        revoke.add_argument("token_id", type=int)

    @audit.as_command  # what it changes is the OS user's, via command
    def handle(self, *args, action: str, username: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named '{username}'")
        try:
            if action == "create":
                token, key = access.create_token(user, options["name"], expires_in_days=options["days"],
                                                 read_only=options["read_only"])
                self.stdout.write(f"{key}\n")
                self.stderr.write(f"token #{token.pk} '{token.name}' for {username}: {self._describe(token)}. "
                                  "Store the key now; it is never shown again.")
            elif action == "revoke":
                token = access.revoke_token(user, options["token_id"])
                self.stdout.write(f"revoked #{token.pk} '{token.name}'")
            else:
                for token in access.tokens_of(user):
                    state = "revoked" if token.revoked_at else "live"
                    self.stdout.write(f"#{token.pk} {token.prefix}… '{token.name}' {state}, {self._describe(token)}")
        except VeronicaError as exc:
            raise CommandError(f"{exc.field}: {exc.message}" if exc.field else exc.message) from None

    @staticmethod
    def _describe(token) -> str:
        scope = "read-only" if token.read_only else "read-write"
        expiry = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "never expires"
        return f"{scope}, {expiry}"
