from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers_app"
    label = "workers_app"
    verbose_name = "Workers"

    def ready(self) -> None:
        # Filled into sessions_app's seams (sessions_app never imports this app).
        from devices_app.ports import provide_node_workers
        from gateway import lifecycle
        from sessions_app.extensions import action_guards, session_projections, turn_runners

        # Importing the handler module registers sessions.dispatch/move/reclaim and environments.*.
        from . import profiles, rpc  # noqa: F401
        from .guards import placement_barrier
        from .nodes.device_provider import DeviceProvider
        from .nodes.runtime import node_runtime, ssh_node_runtime
        from .ports import WorkersOnNodes
        from .providers import providers
        from .providers.local import LocalProvider
        from .providers.static_ssh import StaticSshProvider
        from .runners import select_worker_runner
        from .runtimes import worker_runtimes
        from .selectors import PLACEMENT_PROJECTION_COLUMNS, placement_fields
        from .services.recovery import workers_recover_startup
        from .tasks import recovery_sweep

        session_projections.register(
            "placement", placement_fields, related=("placement",), columns=PLACEMENT_PROJECTION_COLUMNS
        )
        provide_node_workers(WorkersOnNodes())
        action_guards.register(placement_barrier)
        turn_runners.add_selector(select_worker_runner)
        # Providers first: the profiles are checked against what is registered.
        providers.register(StaticSshProvider())
        providers.register(DeviceProvider())
        providers.register(LocalProvider())
        # Environments leased on a node are brought up by the node host (the one worker runtime).
        worker_runtimes.register("device", node_runtime)
        worker_runtimes.register("local", node_runtime)
        worker_runtimes.register("static-ssh", ssh_node_runtime)
        profiles.load_profiles()
        # Recovery: at start (what a dead predecessor left half-done), then periodically (embedded
        # profile: the gateway loop; production: Celery beat runs workers.recovery_sweep).
        lifecycle.on_startup(workers_recover_startup)
        lifecycle.on_sweep(recovery_sweep)
