"""A static-ssh host becomes a node: the gateway installs its node host there over SSH, from the bundle it
serves, and enrolls it with a pre-approved pairing. From then on the host is driven like any node.

One node host per (host, user, work dir) — the host is shared by every lease of its profile — kept in
the profile's ``workDir`` (default ``~/.openclaw-worker``):

* ``state/`` — the node host's state directory (identity, device token, worker bundles, workspaces);
* ``runtime/<bundle sha256>/`` — the node host program, fetched from the gateway's bundle route with the
  node's own token, its digest checked;
* ``venv/`` — the host's own ``python3`` (3.11 or newer) with the bundle's ``requirements.txt``
  installed from the package index with ``--require-hashes``;
* ``node-host.pid``, ``node-host.log``.

Nothing of the gateway's checkout or environment is used on the host. Secrets (the node's key when
the gateway makes it, its token) reach the host on the SSH channel's standard input, never in a
command line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time

from devices_app.services import pairing
from gateway import selectors as gateway_selectors
from gateway.audit import Actor
from gateway.background import release_database_connections
from gateway.exceptions import NotFound
from openclaw_client.identity import DeviceIdentity, derive_device_id
from openclaw_client.node import NODE_HOST_CAPS, NODE_HOST_COMMANDS

from ..addresses import gateway_url, http_origin
from ..bundle import current_bundle
from ..models import NodeWorkerHost, WorkerEnvironment
from ..profiles import profile_for_environment
from ..providers import WorkerProviderError
from ..providers.static_ssh import ssh_run, ssh_target

logger = logging.getLogger(__name__)

ACTOR = Actor("provider:static-ssh")
# Creating the host's venv and installing its packages from the index takes a while the first time.
INSTALL_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 30.0
DEFAULT_CAPACITY = 2

PROBE_SCRIPT = r"""
import json, os
base = os.path.expanduser(BASE)
found = {}
try:
    with open(os.path.join(base, "state", "identity", "device.json")) as handle:
        identity = json.load(handle)
    found = {"deviceId": identity["deviceId"], "publicKey": identity["publicKey"]}
except (OSError, ValueError, KeyError):
    pass
try:
    pid = int(open(os.path.join(base, "node-host.pid")).read().strip())
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        found["running"] = os.path.join(base, "state").encode() in handle.read().split(b"\0")
except (OSError, ValueError):
    found["running"] = False
print(json.dumps(found))
"""

INSTALL_SCRIPT = r"""
import hashlib, io, json, os, shutil, signal, subprocess, sys, tarfile, time, urllib.request
params = json.loads(sys.stdin.readline())
if sys.version_info < (3, 11):
    sys.exit("python3 on this host is older than 3.11")
os.umask(0o077)
base = os.path.expanduser(params["workDir"])
state = os.path.join(base, "state")
identity_dir = os.path.join(state, "identity")
os.makedirs(identity_dir, mode=0o700, exist_ok=True)

def write(path, data):
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)

if params.get("identity"):
    write(os.path.join(identity_dir, "device.json"), params["identity"])
write(os.path.join(identity_dir, "device-auth.json"),
      {"version": 1, "tokens": {"node": {"token": params["token"], "scopes": []}}})

runtime = os.path.join(base, "runtime", params["bundleHash"])
if not os.path.isfile(os.path.join(runtime, ".complete")):
    request = urllib.request.Request(params["bundleUrl"], headers={"Authorization": "Bearer " + params["token"]})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            data = response.read(params["sizeBytes"] + 1)
    except OSError as error:
        sys.exit(f"the gateway's worker bundle could not be fetched from {params['bundleUrl']}: "
                 f"{getattr(error, 'reason', None) or error}")
    if len(data) != params["sizeBytes"] or hashlib.sha256(data).hexdigest() != params["bundleHash"]:
        sys.exit("the worker bundle downloaded from the gateway does not match its digest")
    staging = f"{runtime}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or member.name.startswith("/") or ".." in parts or "" in parts:
                sys.exit("the worker bundle holds an entry that is not a plain relative file: " + member.name)
            target = os.path.join(staging, *parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.extractfile(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
    open(os.path.join(staging, ".complete"), "w").close()
    shutil.rmtree(runtime, ignore_errors=True)
    os.replace(staging, runtime)

venv = os.path.join(base, "venv")
python = os.path.join(venv, "bin", "python")
requirements = os.path.join(runtime, "requirements.txt")
wanted = hashlib.sha256(open(requirements, "rb").read()).hexdigest()
stamp = os.path.join(venv, ".openclaw-requirements")
if not os.path.isfile(stamp) or open(stamp).read() != wanted:
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, stdout=subprocess.DEVNULL)
    installed = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet",
         "--require-hashes", "-r", requirements],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if installed.returncode != 0:
        sys.exit("installing the node host's packages failed: " + (installed.stderr.strip().splitlines() or ["?"])[-1])
    with open(stamp, "w") as handle:
        handle.write(wanted)

pid_file = os.path.join(base, "node-host.pid")
try:
    old = int(open(pid_file).read().strip())
    with open(f"/proc/{old}/cmdline", "rb") as handle:
        if state.encode() in handle.read().split(b"\0"):
            os.killpg(old, signal.SIGTERM)
            for _ in range(100):
                time.sleep(0.05)
                if not os.path.exists(f"/proc/{old}"):
                    break
except (OSError, ValueError):
    pass

log = open(os.path.join(base, "node-host.log"), "ab")
environment = {"PATH": os.defpath, "HOME": os.path.expanduser("~"),
               "PYTHONPATH": runtime, "PYTHONUNBUFFERED": "1"}
process = subprocess.Popen(
    [python, "-m", "openclaw_client.node", "--gateway", params["gatewayUrl"], "--state-dir", state,
     "--capacity", str(params["capacity"]), "--capacity-wait-ms", str(params["capacityWaitMs"]),
     "--name", params["name"]],
    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=base, env=environment,
    start_new_session=True)
with open(pid_file, "w") as handle:
    handle.write(str(process.pid))
print(json.dumps({"pid": process.pid}))
"""


def _hosting(device_id: str) -> bool:
    connection = gateway_selectors.live_node_connection(device_id)
    return (
        connection is not None
        and NodeWorkerHost.objects.filter(node_id=device_id, conn_id=str(connection.conn_id)).exists()
    )


def ensure_ssh_node(environment: WorkerEnvironment) -> str:
    """The device id of the node host on the environment's SSH host, installed, enrolled, started and
    connected (a running, connected one is reused as it is)."""
    profile = profile_for_environment(environment.provider_id, environment.profile_id, environment.profile_snapshot)
    target = ssh_target(profile)
    probe = f"BASE = {json.dumps(target.work_dir)}\n{PROBE_SCRIPT}"
    release_database_connections()  # the host is waited for without a database connection
    probed = json.loads(ssh_run(target, "python3 -", stdin=probe, timeout_s=PROBE_TIMEOUT_S) or "{}")
    # What the host says of itself is believed only as far as its public key proves it: a device id is the hash of
    # the key, so a host (or a command run on it) that writes another node's id in its file gets no other node.
    public_key = probed.get("publicKey") if isinstance(probed.get("publicKey"), str) else None
    device_id = derive_device_id(public_key) if public_key else None
    if device_id is None or probed.get("deviceId") != device_id:
        public_key = device_id = None
    if device_id and probed.get("running") and _hosting(device_id):
        return device_id
    identity_file = None
    if not device_id or not public_key:
        identity = DeviceIdentity.generate()
        device_id, public_key = identity.device_id, identity.public_key
        identity_file = {
            "version": 1,
            "deviceId": identity.device_id,
            "publicKey": identity.public_key,
            "privateKeyPem": identity.private_key_pem(),
        }
    # Enrolled (again) for this start: a fresh token, handed to this host only.
    device, token = pairing.node_enroll(
        public_key=public_key,
        display_name=f"{target.user}@{target.host}",
        commands=list(NODE_HOST_COMMANDS),
        caps=list(NODE_HOST_CAPS),
        actor=ACTOR,
    )
    device_id = device.device_id  # the id the gateway derived from the key it enrolled
    bundle = current_bundle()
    url = gateway_url()
    params = {
        "workDir": target.work_dir,
        "identity": identity_file,
        "token": token,
        "bundleHash": bundle.sha256,
        "bundleUrl": f"{http_origin(url)}/api/workers/bundle/{bundle.sha256}",
        "sizeBytes": bundle.size,
        "gatewayUrl": url,
        "capacity": DEFAULT_CAPACITY,
        "capacityWaitMs": 10_000,
        "name": f"{target.user}@{target.host}",
    }
    stdin = json.dumps(params) + "\n"
    try:
        release_database_connections()
        ssh_run(target, "python3 -c " + _quoted(INSTALL_SCRIPT), stdin=stdin, timeout_s=INSTALL_TIMEOUT_S)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not _hosting(device_id):
            if time.monotonic() >= deadline:
                raise WorkerProviderError(
                    f"the node host on {target.address} did not connect to {url} within {int(CONNECT_TIMEOUT_S)} s "
                    f"(see {target.work_dir}/node-host.log there)"
                )
            # The node host's connect needs a connection of this process's pool: none is held while it is awaited.
            release_database_connections()
            time.sleep(0.1)
    except WorkerProviderError:
        # No node came of this enrollment: it is withdrawn (the next attempt enrolls again).
        with contextlib.suppress(NotFound):
            pairing.node_remove(node_id=device_id, actor=ACTOR)
        raise
    logger.info("node host on %s is node %s", target.address, device_id)
    return device_id


def _quoted(script: str) -> str:
    """``script`` as one single-quoted shell word."""
    return "'" + script.replace("'", "'\"'\"'") + "'"


__all__ = ["ensure_ssh_node"]
