"""Operator pairing from the shell: list requests and devices, approve, reject, remove."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from gateway.audit import Actor
from gateway.exceptions import GatewayError

from ... import selectors
from ...services import pairing


class Command(BaseCommand):
    help = "Approve, reject or remove paired devices and nodes (the same services as device.pair.*)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="Pending requests and paired devices as JSON")
        for name in ("approve", "reject"):
            sub.add_parser(name, help=f"{name.capitalize()} a pending request").add_argument("request_id")
        sub.add_parser("remove", help="Forget a paired device").add_argument("device_id")

    def handle(self, *args, **options):
        actor = Actor.system("cli:manage.py pairing")
        action = options["action"]
        try:
            if action == "list":
                result = selectors.device_pair_list()
            elif action == "approve":
                device = pairing.pairing_request_approve(request_id=options["request_id"], actor=actor)
                result = {"requestId": options["request_id"], "deviceId": device.device_id, "roles": device.roles}
            elif action == "reject":
                request = pairing.pairing_request_reject(request_id=options["request_id"], actor=actor)
                result = {"requestId": options["request_id"], "deviceId": request.device_id}
            else:
                pairing.paired_device_remove(device_id=options["device_id"], actor=actor)
                result = {"deviceId": options["device_id"], "removed": True}
        except GatewayError as error:
            raise CommandError(f"{error.code}: {error.message}") from None
        self.stdout.write(json.dumps(result, indent=2))
