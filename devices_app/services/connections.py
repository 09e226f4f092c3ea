"""The comings and goings of connections, as they touch their devices: what makes a connection routable
from every process (registered only while its device holds the role), and what a disconnect, or a
process's end, records on the device.

Every write of both a device's connection rows and its device row locks the device row first, so these
live here rather than in the gateway core, which keeps the connection records themselves.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict

import psycopg
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from gateway import scopes as sc
from gateway.exceptions import NotPaired
from gateway.models import GatewayConnection, GatewayProcess
from gateway.selectors import result_sets
from gateway.services.connections import ConnectionRecord, Registered, connections_close, process_register

from ..models import DeviceToken, PairedDevice
from ..selectors import node_catalog_changed


def _lock_devices_first(device_ids: list[str]) -> dict[str, PairedDevice]:
    """Every write that touches a device's connection rows and its device row locks the device row
    first (in device id order): ``node_remove`` must, to hold off a concurrent approval, so the
    connection writes do too, or a node disconnecting while its role is removed deadlocks."""
    ids = sorted({d for d in device_ids if d})
    if not ids:
        return {}
    locked = (
        PairedDevice.objects.select_for_update(no_key=True)
        .filter(device_id__in=ids)
        .order_by("device_id")
        .only("device_id", "roles")
    )
    return {device.device_id: device for device in locked}


def process_unregister(*, boot_id: str) -> None:
    with transaction.atomic():
        device_ids = list(
            GatewayConnection.objects.filter(process_id=boot_id)
            .exclude(device_id="")
            .values_list("device_id", flat=True)
        )
        _lock_devices_first(device_ids)
        GatewayProcess.objects.filter(boot_id=boot_id).delete()
        node_catalog_changed()
        if device_ids:
            PairedDevice.objects.filter(device_id__in=device_ids).update(
                last_disconnected_at=timezone.now(), last_seen_at=timezone.now(), last_seen_reason="disconnect"
            )


def connection_register(
    *, record: ConnectionRecord, then: tuple[str, dict] | None = None, requires_scopes: list[str] | None = None
) -> Registered | None:
    """Make a connection routable from every gateway process; a node replaces its older socket.

    ``then`` (SQL text, named parameters): reads to run right after the registration commits, in the
    same round trip where the registration is one statement (operators on PostgreSQL); their rows
    come back in :attr:`Registered.then_rows`. With ``requires_scopes`` (an operator with a device,
    PostgreSQL), the connection is registered only when the device holds the role with those scopes
    approved and a live token of (device, role) that covers them, as a reconnecting paired device
    does; otherwise nothing is written and None is returned (the caller decides the slow way).
    """
    one_statement = _one_statement_writes(record.role)
    if requires_scopes is not None and not (one_statement and record.device_id):
        return None
    try:
        return _register(record, then, requires_scopes, one_statement)
    except IntegrityError:
        # Our process row was swept (a long pause without heartbeats): register again and retry.
        process_register(boot_id=record.boot_id)
        return _register(record, then, requires_scopes, one_statement)


def _register(
    record: ConnectionRecord, then: tuple[str, dict] | None, requires_scopes: list[str] | None, one_statement: bool
) -> Registered | None:
    if not one_statement:
        _connection_insert(record)
        return Registered()
    return _connection_insert_operator_pg(record, then, requires_scopes)


def _one_statement_writes(role: str) -> bool:
    """Operators' connection rows on PostgreSQL are written in one round trip (a node's replaces an
    older socket and changes the catalog: the general path). Inside a caller's transaction (tests),
    the statements run in a savepoint of it instead."""
    return role != sc.ROLE_NODE and connection.vendor == "postgresql"


# Connection rows die with their process anyway: their commits need not wait for the WAL flush
# (pairing decisions and tokens keep full durability).
_ASYNC_COMMIT = "SET LOCAL synchronous_commit TO OFF;\n"

_JSON_COLUMNS = frozenset(
    f.attname for f in GatewayConnection._meta.concrete_fields if f.get_internal_type() == "JSONField"
)
_INSERT_COLUMNS = tuple(f.attname for f in GatewayConnection._meta.concrete_fields)
_INSERT_VALUES = ", ".join(f"%({name})s::jsonb" if name in _JSON_COLUMNS else f"%({name})s" for name in _INSERT_COLUMNS)
_INSERT_HEAD = f"INSERT INTO {GatewayConnection._meta.db_table} ({', '.join(_INSERT_COLUMNS)})"
_DEVICE_TABLE = PairedDevice._meta.db_table
_TOKEN_TABLE = DeviceToken._meta.db_table
# The device row is locked first, by the UPDATE of its last-connected time (the order every write of
# connection and device rows keeps, see _lock_devices_first); the row is inserted only when the device
# still holds the role, so a pairing removed since the connect's check leaves nothing routable.
_REGISTER_DEVICE_SQL = (
    f"WITH device AS (UPDATE {_DEVICE_TABLE} SET last_connected_at = %(connected_at)s, "
    "last_seen_at = %(connected_at)s, last_seen_reason = 'connect' "
    "WHERE device_id = %(device_id)s AND roles @> %(role_list)s::jsonb{requires} RETURNING device_id) "
    f"{_INSERT_HEAD} SELECT {_INSERT_VALUES} FROM device RETURNING conn_id"
)
# A reconnecting paired operator: what the connect would otherwise read to decide that it has nothing to
# pair or mint (its approved scopes, its token's) checked by the same statement. JSON containment is
# stricter than scopes_cover (no implied scopes), so a connect it turns away is only decided the slow way.
_REQUIRES_SCOPES = (
    " AND approved_scopes @> %(required_scopes)s::jsonb AND EXISTS (SELECT 1 FROM "
    f"{_TOKEN_TABLE} t WHERE t.device_id = %(device_id)s AND t.role = %(role)s AND t.revoked_at IS NULL "
    "AND t.scopes @> %(required_scopes)s::jsonb)"
)
_REGISTER_SQL = f"{_INSERT_HEAD} VALUES ({_INSERT_VALUES}) RETURNING conn_id"


def _connection_insert_operator_pg(
    record: ConnectionRecord, then: tuple[str, dict] | None, requires_scopes: list[str] | None
) -> Registered | None:
    """One round trip: the registration in a transaction of its own (one statement), then ``then``.

    Sent as one simple query. Outside a caller's transaction it is ``BEGIN; …; COMMIT;`` followed by
    ``then``, so what ``then`` reads comes after the registration committed; inside one (tests) all of
    it runs in a savepoint.
    """
    values = asdict(record)
    values.update(
        process_id=values.pop("boot_id"),
        node_id=record.node_id or "",
        connected_at=timezone.now(),
        role_list=json.dumps([record.role]),
        required_scopes=json.dumps(requires_scopes or []),
    )
    for name in _JSON_COLUMNS:
        values[name] = json.dumps(values[name])
    if record.device_id:
        register = _REGISTER_DEVICE_SQL.format(requires=_REQUIRES_SCOPES if requires_scopes is not None else "")
    else:
        register = _REGISTER_SQL
    then_sql, then_params = then if then is not None else ("", {})
    own_transaction = not connection.in_atomic_block
    script = _ASYNC_COMMIT + register + ";\n"
    if own_transaction:
        script = "BEGIN;\n" + script + "COMMIT;\n"
    script += then_sql
    with transaction.atomic() if not own_transaction else contextlib.nullcontext():
        with connection.cursor() as cursor:
            try:
                cursor.execute(script, {**values, **then_params})
                results = result_sets(cursor)
            except Exception:
                if own_transaction:
                    _rollback_failed_script()
                raise
    inserted, *then_rows = results
    if not inserted:
        if requires_scopes is not None:
            return None
        raise NotPaired("pairing removed while connecting")
    return Registered(then_rows=then_rows if then is not None else None)


def _rollback_failed_script() -> None:
    """A script that failed inside its ``BEGIN`` leaves the session in the failed transaction: end it,
    so that the connection is usable (and in autocommit, as Django expects) for what follows."""
    raw = connection.connection
    if raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        with contextlib.suppress(Exception):
            raw.execute("ROLLBACK")


def _connection_insert(record: ConnectionRecord) -> None:
    now = timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Connection rows die with their process anyway; their commit need not wait for the
            # WAL flush (pairing decisions and tokens keep full durability).
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        if record.device_id:
            device = _lock_devices_first([record.device_id]).get(record.device_id)
            if device is None or not device.has_role(record.role):
                # Removed between this connect's pairing check and here: not routable after all.
                raise NotPaired("pairing removed while connecting")
        if record.role == sc.ROLE_NODE and record.node_id:
            replaced = list(GatewayConnection.objects.filter(role=sc.ROLE_NODE, node_id=record.node_id))
            connections_close(replaced, reason="replaced by a newer connection")
        GatewayConnection.objects.create(
            conn_id=record.conn_id,
            process_id=record.boot_id,
            channel_name=record.channel_name,
            role=record.role,
            scopes=record.scopes,
            auth_method=record.auth_method,
            device_id=record.device_id,
            node_id=record.node_id or "",
            client_id=record.client_id,
            client_mode=record.client_mode,
            client_version=record.client_version,
            display_name=record.display_name,
            platform=record.platform,
            device_family=record.device_family,
            model_identifier=record.model_identifier,
            instance_id=record.instance_id,
            remote_ip=record.remote_ip,
            caps=record.caps,
            commands=record.commands,
            permissions=record.permissions,
            path_env=record.path_env,
            connected_at=now,
        )
        if record.device_id:
            fields = {"last_connected_at": now, "last_seen_at": now, "last_seen_reason": "connect"}
            if record.role == sc.ROLE_NODE:
                # A node declares its skills and plugin tools per connection (OpenClaw's live session): a new
                # connection starts with none until it publishes them again.
                fields.update(node_skills=[], node_plugin_tools=[])
            PairedDevice.objects.filter(device_id=record.device_id).update(**fields)
        if record.role == sc.ROLE_NODE:
            node_catalog_changed()


# The device row is locked before the connection row goes (the order of _lock_devices_first).
_UNREGISTER_SQL = (
    _ASYNC_COMMIT + f"SELECT 1 FROM {_DEVICE_TABLE} WHERE device_id = "
    f"(SELECT device_id FROM {GatewayConnection._meta.db_table} WHERE conn_id = %(conn_id)s) FOR NO KEY UPDATE;\n"
    f"WITH gone AS (DELETE FROM {GatewayConnection._meta.db_table} WHERE conn_id = %(conn_id)s "
    "RETURNING device_id, role), "
    f"device AS (UPDATE {_DEVICE_TABLE} SET last_disconnected_at = %(now)s, last_seen_at = %(now)s, "
    f"last_seen_reason = 'disconnect' FROM gone WHERE {_DEVICE_TABLE}.device_id = gone.device_id) "
    "SELECT role FROM gone"
)


def connection_unregister(*, conn_id: str) -> bool:
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(_UNREGISTER_SQL, {"conn_id": conn_id, "now": timezone.now()})
            while cursor.nextset():
                pass
            gone = cursor.fetchone()
        if gone is None:
            return False
        if gone[0] == sc.ROLE_NODE:
            node_catalog_changed()
        return True
    with transaction.atomic():
        conn = GatewayConnection.objects.filter(conn_id=conn_id).first()
        if conn is None:
            return False
        _lock_devices_first([conn.device_id])
        conn.delete()
        if conn.role == sc.ROLE_NODE:
            node_catalog_changed()
        if conn.device_id:
            now = timezone.now()
            PairedDevice.objects.filter(device_id=conn.device_id).update(
                last_disconnected_at=now, last_seen_at=now, last_seen_reason="disconnect"
            )
        return True


def node_presence_touch(*, node_id: str, reason: str) -> bool:
    with transaction.atomic():
        touched = PairedDevice.objects.filter(device_id=node_id).update(
            last_seen_at=timezone.now(), last_seen_reason=reason
        )
        if touched:
            node_catalog_changed()
    return bool(touched)
