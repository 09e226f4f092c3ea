"""The bundled native harness keeps its threads and bindings in a database of its own.

A session initialization therefore spans two stores (the gateway database and the harness
database) and cannot lean on one transaction: that is what the guarded rollback is for.
"""

HARNESS_APP = "native_harness"
HARNESS_DB = "harness"


class HarnessRouter:
    def db_for_read(self, model, **hints):
        return HARNESS_DB if model._meta.app_label == HARNESS_APP else None

    def db_for_write(self, model, **hints):
        return HARNESS_DB if model._meta.app_label == HARNESS_APP else None

    def allow_relation(self, obj1, obj2, **hints):
        first, second = obj1._meta.app_label == HARNESS_APP, obj2._meta.app_label == HARNESS_APP
        if first and second:
            return True
        if first or second:
            return False  # no foreign keys across the two stores
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if app_label == HARNESS_APP:
            return db == HARNESS_DB
        return db != HARNESS_DB
