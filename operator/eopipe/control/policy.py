"""The admin's tenant policy: what a pipeline's author may ask of the operator (docs/security.md).

Pure: facts in (the spec, the policy, the Secrets' metadata), the refusals out, each as
`spec.<field>: <why>`, the field as the manifest writes it. The operator refuses a pipeline
with any refusal before it applies anything (status Stalled/PolicyDenied); `eopipe validate`
prints the same lines; the chart's ValidatingAdmissionPolicy
(charts/eopipe/templates/admissionpolicy.yaml) refuses the same fields at admission, from the
same values.

Patterns are globs whose only wildcard is `*` (any run of characters), so the chart can turn
them into the admission policy's regular expressions the same way `glob_regex` does here.
Every list extends the defaults below, which an admin cannot drop by leaving a key out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from kubernetes.utils import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from eopipe.control import access
from eopipe.core.kafkaconf import SecretNotOpen, opened_to

# Spark settings that run code, read files, change identity or reach past the pipeline's pods.
# spark.kubernetes.* decides images, volumes (hostPath), pod templates, the namespace, the
# service account, the driver's env, pod labels and annotations: denied as a family, with the few
# harmless ones (resources, allocation pace) allowed. A JVM option can set any of them as a system
# property (-Dspark.*), which Spark reads as configuration, or run a command: *JavaOptions.
# spark.hadoop.* is judged as the Hadoop setting it is (DENIED_HADOOP_CONF).
DENIED_SPARK_CONF = (
    "spark.kubernetes.*", "*.extraJavaOptions", "*.defaultJavaOptions", "*.extraClassPath", "*.extraLibraryPath",
    "spark.jars", "spark.jars.*", "spark.plugins", "spark.plugins.*", "spark.*Env.*", "spark.files",
    "spark.archives", "spark.submit.*", "spark.pyspark.*", "spark.master", "spark.driver.host",
    "spark.extraListeners", "spark.sql.extensions", "spark.sql.queryExecutionListeners",
    "spark.sql.streaming.streamingQueryListeners", "spark.sql.catalog.*", "spark.metrics.conf*",
    "spark.eventLog.*", "spark.redaction.*", "spark.authenticate*", "spark.ssl*", "spark.ui.filters",
    "spark.sql.hive.metastore.jars*", "spark.executor.plugins", "spark.driver.resource.*", "spark.executor.resource.*",
)
ALLOWED_SPARK_CONF = (
    "spark.kubernetes.executor.request.cores", "spark.kubernetes.driver.request.cores",
    "spark.kubernetes.executor.limit.cores", "spark.kubernetes.driver.limit.cores",
    "spark.kubernetes.memoryOverheadFactor", "spark.kubernetes.allocation.batch.size",
    "spark.kubernetes.allocation.batch.delay", "spark.kubernetes.executor.deleteOnTermination",
)  # not labels (a NetworkPolicy selects by them) nor annotations (AppArmor, sidecars)
# Hadoop settings that load classes or pick credentials the tenant did not bring.
DENIED_HADOOP_CONF = ("*.impl", "*credentials.provider*", "hadoop.security.*", "*.assumed.role.*")
# Names an interpreter, a loader or a client acts on before any code of ours runs.
DENIED_ENV = (
    "PYTHON*", "LD_*", "BROWSER", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "JAVA_HOME",
    "JAVA_OPTS", "CLASSPATH", "EOPIPE_*", "SPARK_*", "PYSPARK_*", "HADOOP_*", "KUBERNETES_*", "POD_*",
    "PATH", "HOME", "SHELL", "ENV", "BASH_ENV", "GLIBC_TUNABLES", "GCONV_PATH", "MALLOC_*", "NODE_OPTIONS",
    "PERL5*", "RUBY*", "SSL_CERT_*", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "OPENSSL_*",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "TMPDIR", "HOSTNAME", "AWS_CONTAINER_*", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_EC2_METADATA*",
    # The AWS SDK's endpoint and config from env would send the dedup pods' snapshots past
    # tenantPolicy.objectStore.endpoints (spec.dedup.backup.endpoint is the checked way).
    "AWS_ENDPOINT_URL*", "AWS_CONFIG_FILE", "AWS_PROFILE",
)
# Hadoop settings (in hadoopConf, or sparkConf as spark.hadoop.*) that say where s3a sends the
# checkpoint and its credentials: held to tenantPolicy.objectStore.endpoints, as the backups are.
SPARK_HADOOP = "spark.hadoop."
S3A_ROUTE = r"(?:spark\.hadoop\.)?fs\.s3a\.(?:bucket\..+\.)?(?:endpoint|proxy\.host)"
ENV_ALLOW_PATTERN = r"[A-Z][A-Z0-9_]*"
# Pod annotations that other controllers act on: a sidecar with an image of its own (Istio,
# Linkerd), secrets injected by a role's name (Vault's agent), extra networks past NetworkPolicy
# (Multus), a weaker confinement (AppArmor, seccomp), the runtime's own settings (CRI-O).
DENIED_ANNOTATION_KEYS = (
    "sidecar.istio.io/*", "proxy.istio.io/*", "linkerd.io/*", "config.linkerd.io/*", "vault.hashicorp.com/*",
    "k8s.v1.cni.cncf.io/*", "v1.multus-cni.io/*", "container.apparmor.security.beta.kubernetes.io/*",
    "seccomp.security.alpha.kubernetes.io/*", "io.kubernetes.cri-o.*",
)
# Whether the mesh injects its proxy as the admin configured it: no image or volume of the tenant's.
ALLOWED_ANNOTATION_KEYS = ("sidecar.istio.io/inject", "linkerd.io/inject")
# Pod labels that other controllers act on: which workload revision a pod is or which pod of a
# StatefulSet (Kubernetes' own, under its reserved prefixes), which mesh revision or waypoint
# handles its traffic (Istio).
DENIED_LABEL_KEYS = (
    "controller-revision-hash", "pod-template-hash", "kubernetes.io/*", "k8s.io/*", "*.kubernetes.io/*", "*.k8s.io/*",
    "istio.io/*", "*.istio.io/*", "linkerd.io/*", "*.linkerd.io/*",
)
ALLOWED_LABEL_KEYS = ("app.kubernetes.io/*", "sidecar.istio.io/inject")
# Taints only the cluster's own nodes carry; the empty key tolerates every taint.
DENIED_TOLERATION_KEYS = ("", "node-role.kubernetes.io/*")
MAX_STORAGE = "500Gi"


class _Section(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SparkPolicy(_Section):
    allowed_conf: tuple[str, ...] = Field((), description="sparkConf keys allowed besides the defaults")
    denied_conf: tuple[str, ...] = Field((), description="sparkConf keys denied besides the defaults")
    denied_hadoop_conf: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = Field(
        (), description="driver ServiceAccounts a pipeline may name besides the operator's <pipeline>-spark")


class EnvPolicy(_Section):
    allow_pattern: str = ENV_ALLOW_PATTERN
    denied: tuple[str, ...] = ()


class KafkaPolicy(_Section):
    bootstrap_servers: tuple[str, ...] = Field((), description="host:port globs; empty: any")


class ObjectStorePolicy(_Section):
    endpoints: tuple[str, ...] = Field((), description="endpoint URL globs spec.dedup.backup.endpoint and s3a's "
                                                       "endpoint and proxy settings may name; empty: any")


class RestoreGrant(_Section):
    from_: str = Field(alias="from", min_length=1, description="namespace glob of the pipelines that may be continued")
    to: str = Field(min_length=1, description="namespace glob of the pipelines that may continue them")


class SchedulingPolicy(_Section):
    toleration_keys: tuple[str, ...] = ("*",)
    denied_toleration_keys: tuple[str, ...] = ()
    node_selector_keys: tuple[str, ...] = ("*",)
    priority_classes: tuple[str, ...] = ()


class PodPolicy(_Section):
    annotation_keys: tuple[str, ...] = Field(("*",), description="dedup pod annotation keys a pipeline may set")
    denied_annotation_keys: tuple[str, ...] = ()
    label_keys: tuple[str, ...] = Field(("*",), description="dedup pod label keys a pipeline may set")
    denied_label_keys: tuple[str, ...] = ()


class TenantPolicy(_Section):
    spark: SparkPolicy = SparkPolicy()
    env: EnvPolicy = EnvPolicy()
    kafka: KafkaPolicy = KafkaPolicy()
    object_store: ObjectStorePolicy = ObjectStorePolicy()
    scheduling: SchedulingPolicy = SchedulingPolicy()
    pods: PodPolicy = PodPolicy()
    max_storage: str = MAX_STORAGE
    restores: tuple[RestoreGrant, ...] = Field(
        (), description="spec.restoreFrom across namespaces: which namespace's pipelines may be continued from "
                        "which; within one namespace it needs no grant")


def parse(doc: Mapping | None) -> TenantPolicy:
    """The policy from its JSON/YAML form (the chart's `tenantPolicy` value); ValueError with the
    first problem."""
    try:
        policy = TenantPolicy.model_validate(doc or {})
        parse_quantity(policy.max_storage)
        re.compile(policy.env.allow_pattern)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"tenantPolicy.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    except (ValueError, re.error) as e:
        raise ValueError(f"tenantPolicy: {e}") from None
    return policy


@lru_cache(maxsize=1024)
def glob_regex(glob: str) -> re.Pattern:
    return re.compile(re.escape(glob).replace(r"\*", ".*"))


def matches(name: str, globs: Iterable[str]) -> bool:
    return any(glob_regex(g).fullmatch(name) for g in globs)


def _store_refusal(endpoint: str, policy: TenantPolicy) -> str | None:
    allowed = policy.object_store.endpoints
    if allowed and not matches(endpoint, allowed):
        return f"{endpoint} is not allowed by the tenant policy (tenantPolicy.objectStore.endpoints)"
    return None


def _spark_conf_refusal(key: str, value: str, policy: TenantPolicy, allowed_registries) -> str | None:
    if key.startswith(SPARK_HADOOP) and (why := hadoop_refusal(key[len(SPARK_HADOOP):], policy)):
        return why
    if matches(key, (*DENIED_SPARK_CONF, *policy.spark.denied_conf)) and \
            not matches(key, (*ALLOWED_SPARK_CONF, *policy.spark.allowed_conf)):
        return "not allowed by the tenant policy (tenantPolicy.spark.allowedConf)"
    if key.endswith("container.image") and (why := access.allowed(value, allowed_registries)):
        return why
    env = re.fullmatch(r"spark\.(?:executorEnv|kubernetes\.driverEnv|yarn\.appMasterEnv)\.(.+)", key)
    if env and (why := env_refusal(env.group(1), policy)):
        return why
    return None


def hadoop_refusal(key: str, policy: TenantPolicy) -> str | None:
    """A Hadoop setting `key`, from hadoopConf or (as spark.hadoop.<key>) from sparkConf."""
    if matches(key, (*DENIED_HADOOP_CONF, *policy.spark.denied_hadoop_conf)):
        return "not allowed by the tenant policy (tenantPolicy.spark.deniedHadoopConf)"
    return None


def env_refusal(name: str, policy: TenantPolicy) -> str | None:
    if not re.fullmatch(policy.env.allow_pattern, name):
        return f"environment variable {name} does not match the tenant policy's allowPattern"
    if matches(name, (*DENIED_ENV, *policy.env.denied)):
        return f"environment variable {name} is reserved (it can change what the container runs)"
    return None


def prefix_refusal(prefix: str, policy: TenantPolicy) -> str | None:
    """envFrom imports keys nobody reviewed: its prefix must keep every name they could make out of
    the reserved ones. A reserved entry is a name, or a glob read up to its first `*`."""
    if not prefix:
        return "envFrom needs a prefix (the Secret's or ConfigMap's keys become variable names)"
    if not re.fullmatch(policy.env.allow_pattern, prefix + "X"):
        return f"envFrom prefix {prefix} does not match the tenant policy's allowPattern"
    for denied in (*DENIED_ENV, *policy.env.denied):
        head = denied.split("*", 1)[0]
        if head.startswith(prefix) or ("*" in denied and prefix.startswith(head)):
            return f"envFrom prefix {prefix} could make the reserved variable {denied}"
    return None


def _tolerations(field: str, tolerations, policy: TenantPolicy) -> list[str]:
    out = []
    for i, t in enumerate(tolerations):
        key = t.get("key") or ""
        if not matches(key, policy.scheduling.toleration_keys) or \
                matches(key, (*DENIED_TOLERATION_KEYS, *policy.scheduling.denied_toleration_keys)):
            out.append(f"{field}[{i}]: toleration of {key or 'every taint'} is not allowed by the tenant "
                       "policy (tenantPolicy.scheduling.tolerationKeys)")
    return out


def node_affinity_keys(affinity) -> list[str]:
    """The node label keys (and node fields) a nodeAffinity selects by, required and preferred:
    the same choice of nodes as a nodeSelector's keys. Free-form input: what is not a term is
    skipped (the API server refuses such a pod)."""
    def dicts(x) -> list[dict]:
        return [d for d in x if isinstance(d, dict)] if isinstance(x, list) else []
    na = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if not isinstance(na, dict):
        return []
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = dicts(required.get("nodeSelectorTerms")) if isinstance(required, dict) else []
    terms += [w["preference"] for w in dicts(na.get("preferredDuringSchedulingIgnoredDuringExecution"))
              if isinstance(w.get("preference"), dict)]
    return [str(e.get("key", "")) for t in terms for part in ("matchExpressions", "matchFields")
            for e in dicts(t.get(part))]


def _scheduling(field: str, node_selector, tolerations, priority_class, policy: TenantPolicy,
                affinity=None) -> list[str]:
    out = _tolerations(f"{field}.tolerations", tolerations, policy)
    out += [f"{field}.nodeSelector: key {k} is not allowed by the tenant policy "
            "(tenantPolicy.scheduling.nodeSelectorKeys)"
            for k in node_selector if not matches(k, policy.scheduling.node_selector_keys)]
    out += [f"{field}.affinity.nodeAffinity: key {k} is not allowed by the tenant policy "
            "(tenantPolicy.scheduling.nodeSelectorKeys)"
            for k in node_affinity_keys(affinity) if not matches(k, policy.scheduling.node_selector_keys)]
    if priority_class is not None and priority_class not in policy.scheduling.priority_classes:
        out.append(f"{field}.priorityClassName: {priority_class} is not allowed by the tenant policy "
                   "(tenantPolicy.scheduling.priorityClasses)")
    return out


_POD_KEYS = {"annotation": (DENIED_ANNOTATION_KEYS, ALLOWED_ANNOTATION_KEYS),
             "label": (DENIED_LABEL_KEYS, ALLOWED_LABEL_KEYS)}


def _pod_keys(kind: str, keys, policy: TenantPolicy) -> list[str]:
    """The dedup pods' annotation or label keys (`kind`) that the admin's lists or the built-in
    ones refuse; a built-in exception gives way to the admin's denial."""
    allow, deny = getattr(policy.pods, f"{kind}_keys"), getattr(policy.pods, f"denied_{kind}_keys")
    denied, excepted = _POD_KEYS[kind]
    return [f"dedup.podTemplate.{kind}s[{k}]: not allowed by the tenant policy (tenantPolicy.pods.{kind}Keys)"
            for k in keys if not matches(k, allow) or matches(k, deny)
            or (matches(k, denied) and not matches(k, excepted))]


def _envs(field: str, env, env_from, policy: TenantPolicy) -> list[str]:
    out = [f"{field}.env[{i}]: {why}" for i, e in enumerate(env) if (why := env_refusal(e.name, policy))]
    out += [f"{field}.envFrom[{i}]: {why}" for i, e in enumerate(env_from)
            if (why := prefix_refusal(e.get("prefix") or "", policy))]
    return out


def _storage(field: str, size: str, policy: TenantPolicy) -> list[str]:
    if parse_quantity(size) > parse_quantity(policy.max_storage):
        return [f"{field}: {size} is above the tenant policy's maxStorage {policy.max_storage} (tenantPolicy.maxStorage)"]
    return []


def bootstrap_refusals(servers: str, policy: TenantPolicy) -> list[str]:
    allow = policy.kafka.bootstrap_servers
    if not allow:
        return []
    return [f"kafka.bootstrapServers: {s} is not allowed by the tenant policy (tenantPolicy.kafka.bootstrapServers)"
            for s in (x.strip() for x in servers.split(",")) if s and not matches(s, allow)]


def restore_refusal(namespace: str | None, spec, policy: TenantPolicy) -> str | None:
    """A pipeline in `namespace` continuing one of another namespace takes that one's consumer
    group, transactional ids and topics, so it reads that tenant's records: only where the admin
    granted it. `namespace` None (a manifest without one, read offline): not judged."""
    origin = spec.restore_from
    if origin is None or namespace is None or origin.namespace == namespace:
        return None
    if any(glob_regex(g.from_).fullmatch(origin.namespace) and glob_regex(g.to).fullmatch(namespace)
           for g in policy.restores):
        return None
    return (f"restoreFrom: continuing a pipeline of namespace {origin.namespace} in {namespace} is not allowed "
            "by the tenant policy (tenantPolicy.restores)")


def refusals(spec, policy: TenantPolicy, allowed_registries: tuple[str, ...] = (),
             namespace: str | None = None) -> list[str]:
    """Everything in `spec` (a PipelineSpec) of a pipeline in `namespace` the policy refuses, as
    `spec.<field>: <why>`."""
    out = [why.removeprefix("spec.") for why in access.refused_images(spec, allowed_registries)]
    out += [why] if (why := restore_refusal(namespace, spec, policy)) else []
    out += bootstrap_refusals(spec.kafka.bootstrap_servers, policy)
    dedup = spec.dedup
    endpoint = dedup.backup.endpoint if dedup.backup is not None else None
    if endpoint and (why := _store_refusal(endpoint, policy)):
        out.append(f"dedup.backup.endpoint: {why}")
    out += _storage("dedup.storage.size", dedup.storage.size, policy)
    tpl = dedup.pod_template
    out += _envs("dedup.podTemplate", tpl.env, (), policy)
    out += _pod_keys("annotation", tpl.annotations, policy) + _pod_keys("label", tpl.labels, policy)
    out += _scheduling("dedup.podTemplate", tpl.node_selector, tpl.tolerations, tpl.priority_class_name, policy,
                       tpl.affinity)
    proc = spec.processing
    if proc is not None:
        if proc.service_account is not None and proc.service_account not in policy.spark.service_accounts:
            out.append(f"processing.serviceAccount: {proc.service_account} is not allowed by the tenant policy "
                       "(tenantPolicy.spark.serviceAccounts); leave it out to run as <pipeline>-spark")
        out += [f"processing.sparkConf[{k}]: {why}" for k, v in proc.spark_conf.items()
                if (why := _spark_conf_refusal(k, v, policy, allowed_registries))]
        out += [f"processing.hadoopConf[{k}]: {why}" for k in proc.hadoop_conf if (why := hadoop_refusal(k, policy))]
        out += [f"processing.{field}[{k}]: {why}" for field, conf in (("sparkConf", proc.spark_conf),
                                                                       ("hadoopConf", proc.hadoop_conf))
                for k, v in conf.items() if re.fullmatch(S3A_ROUTE, k) and (why := _store_refusal(v, policy))]
        out += _envs("processing", proc.env, proc.env_from, policy)
        out += _scheduling("processing", proc.node_selector, proc.tolerations, None, policy, proc.affinity)
        if proc.checkpoint is not None and proc.checkpoint.pvc is not None and proc.checkpoint.pvc.claim_name is None:
            out += _storage("processing.checkpoint.pvc.size", proc.checkpoint.pvc.size, policy)
    return [f"spec.{r}" for r in out]


def secret_refs(spec) -> list[tuple[str, str]]:
    """(field, Secret name) of every Secret the spec names: Kafka credentials, env from Secrets,
    image pull Secrets. Each must be opened to the pipeline (kafkaconf.OPT_IN)."""
    out: list[tuple[str, str]] = []
    kafka = spec.kafka
    if kafka.sasl is not None:
        out += [(f"kafka.sasl.{f}", getattr(kafka.sasl, f).name) for f in ("username", "password")]
    if kafka.tls is not None:
        out += [(f"kafka.tls.{f}", ref.name) for f in ("ca", "cert", "key") if (ref := getattr(kafka.tls, f))]

    def env_refs(field: str, env) -> list[tuple[str, str]]:
        return [(f"{field}.env[{i}].valueFrom.secretKeyRef", str(ref.get("name", "")))
                for i, e in enumerate(env) if (ref := (e.value_from or {}).get("secretKeyRef")) is not None]

    creds = spec.dedup.backup.credentials if spec.dedup.backup is not None else None
    if creds is not None:
        out += [(f"dedup.backup.credentials.{f}", getattr(creds, attr).name)
                for f, attr in (("accessKeyId", "access_key_id"), ("secretAccessKey", "secret_access_key"))]
    out += env_refs("dedup.podTemplate", spec.dedup.pod_template.env)
    if spec.processing is not None:
        out += env_refs("processing", spec.processing.env)
        out += [(f"processing.envFrom[{i}].secretRef", str(e["secretRef"].get("name", "")))
                for i, e in enumerate(spec.processing.env_from) if isinstance(e.get("secretRef"), dict)]
    out += [(f"imagePullSecrets[{i}]", r.name) for i, r in enumerate(spec.image_pull_secrets)]
    return out


def claim_refs(spec) -> list[tuple[str, str]]:
    """(field, claim name) of a PersistentVolumeClaim the spec names for the Spark checkpoint:
    mounted read-write in the driver (and executors), so it must be opened to the pipeline as a
    Secret is, or a tenant could name another pipeline's state or another team's data."""
    proc = spec.processing
    pvc = proc.checkpoint.pvc if proc is not None and proc.checkpoint is not None else None
    return [("processing.checkpoint.pvc.claimName", pvc.claim_name)] if pvc is not None and pvc.claim_name else []


def opt_in_refusals(kind: str, refs: list[tuple[str, str]], annotations: Mapping[str, dict | None],
                    pipeline: str) -> list[str]:
    """`annotations`: each named object's (a Secret or PersistentVolumeClaim, `kind`), None
    where it does not exist (which reads the same as not opened, so a status tells no tenant
    which objects exist)."""
    return [f"spec.{field}: {SecretNotOpen(name, pipeline, kind)}" for field, name in refs
            if not opened_to(annotations.get(name), pipeline)]


def builtin() -> dict:
    """The built-in lists, as the chart's admission policy reads them
    (charts/eopipe/files/tenant-policy-builtin.json, kept equal by tests/unit/test_policy.py)."""
    return {"deniedSparkConf": list(DENIED_SPARK_CONF), "allowedSparkConf": list(ALLOWED_SPARK_CONF),
            "deniedHadoopConf": list(DENIED_HADOOP_CONF), "deniedEnv": list(DENIED_ENV),
            "deniedTolerationKeys": list(DENIED_TOLERATION_KEYS), "deniedAnnotationKeys": list(DENIED_ANNOTATION_KEYS),
            "allowedAnnotationKeys": list(ALLOWED_ANNOTATION_KEYS), "deniedLabelKeys": list(DENIED_LABEL_KEYS),
            "allowedLabelKeys": list(ALLOWED_LABEL_KEYS)}


if __name__ == "__main__":
    import json
    print(json.dumps(builtin(), indent=2))
