from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers_app"
    label = "workers_app"
    verbose_name = "Workers"

    def ready(self) -> None:
        # The ports of the apps below (they never import this app): sessions' placements, the node catalog.
        from devices_app.ports import provide_node_workers
        from gateway import lifecycle
        from sessions_app.ports import provide_placements

        # Importing the handler module registers sessions.dispatch/move/reclaim and environments.*.
        from . import profiles, rpc  # noqa: F401
        from .nodes.device_provider import DeviceProvider
        from .nodes.runtime import node_runtime, ssh_node_runtime
        from .ports import WorkersOnNodes, WorkersPlacements
        from .providers import providers
        from .providers.local import LocalProvider
        from .providers.static_ssh import StaticSshProvider
        from .runtimes import worker_runtimes
        from .services.recovery import workers_recover_startup
        from .tasks import recovery_sweep

        provide_placements(WorkersPlacements())
        provide_node_workers(WorkersOnNodes())
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
