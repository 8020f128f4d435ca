"""The control plane's PKI and kubeconfigs, made with the openssl CLI (ECDSA P-256 keys are
quick to generate): a cluster CA, the apiserver's serving certificate, a client certificate per
identity, a front-proxy CA and client, and the service-account signing key pair."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

KUBERNETES_SERVICE_IP = "10.0.0.1"  # the first address of the service range: the apiserver's SAN
PKI_LAYOUT = "2"  # bump when generate_pki() makes new files: older workdirs regenerate


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{r.stdout}")


def _new_key(pki: Path, name: str) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", f"{name}.key", cwd=pki)
    os.chmod(pki / f"{name}.key", 0o600)


def _sign(pki: Path, name: str, subject: str, extensions: list[str], ca: str = "ca") -> None:
    """Key + certificate `name` signed by the CA `ca` in pki/, valid for ten years."""
    _new_key(pki, name)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr",
             cwd=pki)
    (pki / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=pki)


def _client_ext() -> list[str]:
    return ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
            "extendedKeyUsage=clientAuth"]


def generate_pki(pki: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert, client certs and the service-account signing key pair;
    extra_ips are more addresses the apiserver is reached at (a node tier's node IP)."""
    pki.mkdir(parents=True, exist_ok=True)
    _new_key(pki, "ca")
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=eopipe-local-ca",
             "-days", "3650", "-sha256",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
             "-out", "ca.crt", cwd=pki)
    sans = ",".join([
        "IP:127.0.0.1", f"IP:{KUBERNETES_SERVICE_IP}", "DNS:localhost", "DNS:kubernetes",
        "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local", *(f"IP:{ip}" for ip in extra_ips),
    ])
    _sign(pki, "apiserver", "/CN=kube-apiserver",
          ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
           "extendedKeyUsage=serverAuth", f"subjectAltName={sans}"])
    _sign(pki, "admin", "/O=system:masters/CN=eopipe-admin", _client_ext())
    _sign(pki, "controller-manager", "/CN=system:kube-controller-manager", _client_ext())
    _sign(pki, "scheduler", "/CN=system:kube-scheduler", _client_ext())
    # Front proxy (aggregation layer, request-header authentication): its own CA, so that
    # only the apiserver's proxy client may assert identities in X-Remote-* headers.
    _new_key(pki, "front-proxy-ca")
    _openssl("req", "-x509", "-new", "-key", "front-proxy-ca.key",
             "-subj", "/CN=eopipe-local-front-proxy-ca", "-days", "3650", "-sha256",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
             "-out", "front-proxy-ca.crt", cwd=pki)
    _sign(pki, "front-proxy-client", "/CN=front-proxy-client", _client_ext(),
          ca="front-proxy-ca")
    # Service-account tokens: the controller-manager and apiserver sign, the apiserver verifies.
    _new_key(pki, "sa")
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for leftover in pki.glob("*.csr"):
        leftover.unlink()
    (pki / ".complete").write_text(_layout(extra_ips) + "\n")


def _write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> None:
    # JSON is YAML; kubectl, client-go and the Python client read it.
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "eopipe-local",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user,
                   "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "eopipe-local",
                      "context": {"cluster": "eopipe-local", "user": user,
                                  "namespace": "default"}}],
        "current-context": "eopipe-local",
        "preferences": {},
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    os.chmod(path, 0o600)


def _layout(extra_ips: tuple[str, ...]) -> str:
    return " ".join((PKI_LAYOUT, *extra_ips))


def ensure_pki(pki: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """Generates the PKI unless pki/ holds a complete one of the current layout."""
    marker = pki / ".complete"
    if not marker.exists() or marker.read_text().strip() != _layout(extra_ips):
        generate_pki(pki, extra_ips)


def write_kubeconfigs(workdir: Path, pki: Path, server: str) -> None:
    """admin.kubeconfig (system:masters) and one kubeconfig per component identity."""
    for name, ident in (("admin", "eopipe-admin"),
                        ("controller-manager", "system:kube-controller-manager"),
                        ("scheduler", "system:kube-scheduler")):
        _write_kubeconfig(workdir / f"{name}.kubeconfig", server, pki / "ca.crt",
                          pki / f"{name}.crt", pki / f"{name}.key", ident)
