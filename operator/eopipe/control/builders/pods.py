"""What every pod the operator makes shares: the restricted Pod Security Standard and the image
pull secrets (the dedup StatefulSet's pods and the SparkApplication's driver and executors).

https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted: non-root, no
privilege escalation, every capability dropped, the runtime's default seccomp profile. A
namespace labelled `pod-security.kubernetes.io/enforce=restricted` admits these pods.
"""

from __future__ import annotations

from eopipe.core.spec import PipelineSpec

# The images' user and group (Dockerfile, stage python-base: eopipe, uid/gid 10001).
RUN_AS = 10001


def pod_security_context() -> dict:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(read_only_root_filesystem: bool) -> dict:
    ctx = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root_filesystem:
        ctx["readOnlyRootFilesystem"] = True
    return ctx


def image_pull_secrets(spec: PipelineSpec) -> list[str]:
    return [ref.name for ref in spec.image_pull_secrets]
