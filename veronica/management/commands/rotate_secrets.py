"""Re-encrypt every stored secret under the first key of VERONICA_SECRETS_KEY, while the app runs.

Rotation without downtime: (1) put a new key in front, `VERONICA_SECRETS_KEY=new,old`, and restart
the processes one by one (each decrypts under either key meanwhile); (2) run this command; (3) drop
the old key: `VERONICA_SECRETS_KEY=new`, and restart again. `--new-key` prints a fresh Fernet key.
"""
from __future__ import annotations

from cryptography.fernet import Fernet
from django.core.management.base import BaseCommand, CommandError

from veronica.swarm import audit, secrets
from veronica.plumbing import secret_store


class Command(BaseCommand):
    help = "Re-encrypt every secret under the first VERONICA_SECRETS_KEY key (--new-key: print a fresh key)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--new-key", action="store_true", help="print a new Fernet key and do nothing else")
        parser.add_argument("--batch", type=int, default=200, help="rows re-encrypted per transaction (default 200)")

    @audit.as_command
    def handle(self, *args, **options) -> None:
        if options["new_key"]:
            self.stdout.write(Fernet.generate_key().decode())
            return
        try:
            done = secrets.rotate_all(batch=max(1, options["batch"]))
        except secret_store.KeyMissing as exc:
            raise CommandError(str(exc)) from None
        except secret_store.InvalidToken:
            raise CommandError("a secret is encrypted under none of the keys in VERONICA_SECRETS_KEY; "
                               "keep the old key in the list until every row is rotated") from None
        self.stdout.write(f"re-encrypted {done} secrets under the first key")
