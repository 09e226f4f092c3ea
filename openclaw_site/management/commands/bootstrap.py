"""First start of the embedded profile: state dir, gateway token and an admin login."""

from __future__ import annotations

import os
import secrets

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, connections, transaction
from psycopg import sql

from gateway import secret_files
from gateway.conf import ensure_gateway_token


class Command(BaseCommand):
    help = "Migrate, create the gateway token and the first admin login if missing, and print where they are."

    def add_arguments(self, parser):
        parser.add_argument("--admin-username", default=os.environ.get("OPENCLAW_ADMIN_USERNAME", "admin"))

    def handle(self, *args, **options):
        for alias in ("default", "harness"):
            if self._create_postgres_database(alias):
                self.stdout.write(f"Created the PostgreSQL database {connections[alias].settings_dict['NAME']}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("migrate", database="harness", interactive=False, verbosity=0)
        token, created = ensure_gateway_token()
        state_dir = settings.STATE_DIR
        self.stdout.write(f"State directory: {state_dir}")
        if os.environ.get("OPENCLAW_GATEWAY_TOKEN"):
            self.stdout.write("Gateway token: from OPENCLAW_GATEWAY_TOKEN")
        elif created:
            # Shown once, on the start that generated it; afterwards only where it is kept.
            self.stdout.write(f"Gateway token (generated): {token}")
            self.stdout.write(f"  kept in {state_dir / 'gateway-token'}")
        else:
            self.stdout.write(f"Gateway token: kept in {state_dir / 'gateway-token'}")
        User = get_user_model()
        username = options["admin_username"]
        credentials_file = state_dir / "admin-credentials"
        if self._create_admin(User, username, credentials_file):
            self.stdout.write(f"Admin login created: {username} (password in {credentials_file})")
        elif credentials_file.exists():
            self.stdout.write(f"Admin login: {username} (password in {credentials_file})")
        else:
            self.stdout.write(f"Admin login: {username} (made elsewhere: its password is not kept in {state_dir})")

    @staticmethod
    def _create_postgres_database(alias: str) -> bool:
        """A first start on PostgreSQL creates the database the URL names when the server lacks it (the way
        SQLite creates its file), through the server's ``postgres`` database. Any other failure to connect
        (server down, wrong password) is reported as it is, without a traceback."""
        if connections[alias].vendor != "postgresql":
            return False
        params = connections[alias].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        name = params["dbname"]
        try:
            psycopg.connect(**params, connect_timeout=10).close()
            return False
        except psycopg.OperationalError as error:
            if "does not exist" not in str(error):
                raise CommandError(f"cannot connect to PostgreSQL database {name}: {error}") from None
        try:
            with psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True, connect_timeout=10) as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False  # a concurrent first start created it
        except psycopg.Error as error:
            raise CommandError(f"PostgreSQL database {name} does not exist and cannot be created: {error}") from None
        return True

    @staticmethod
    def _create_admin(User, username: str, credentials_file) -> bool:
        """Create the first admin unless it exists; a concurrent first start may win the insert."""
        if User.objects.filter(username=username).exists():
            return False
        password = os.environ.get("OPENCLAW_ADMIN_PASSWORD") or secrets.token_urlsafe(18)
        try:
            with transaction.atomic():
                User.objects.create_superuser(username=username, email="", password=password)
                # Written inside the transaction: the file exists once the login does.
                secret_files.write_private(credentials_file, f"username={username}\npassword={password}")
        except IntegrityError:
            return False
        return True
