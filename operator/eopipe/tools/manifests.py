"""`eopipe validate` and `eopipe render`: pipeline manifests checked as the API server checks
them, and the objects and topics the operator makes of them; no cluster and no Kafka needed."""

from __future__ import annotations

import re
import sys
from typing import TextIO

import yaml

from eopipe.control import policy, rebalance, topics
from eopipe.control.builders import access, checkpoint
from eopipe.control.builders.pipeline import objects
from eopipe.control.builders.topics import desired_topics
from eopipe.control.settings import Settings
from eopipe.core import manifest
from eopipe.core.durations import duration_ms
from eopipe.core.names import Names
from eopipe.core.spec import DEPRECATED_VERSIONS, GROUP, KIND, deprecation_warning

VALID, INVALID, USAGE = 0, 1, 2


class _Dumper(yaml.SafeDumper):
    """Writes a dict used twice (the builders share label dicts) twice, never as an alias."""

    def ignore_aliases(self, data) -> bool:
        return True


class Unreadable(Exception):
    """The file cannot be opened or read (a usage error: exit 2)."""


class NotYaml(Exception):
    """The file is not YAML; the message names the file and the line: `FILE:LINE: not YAML: ...`."""


def read(path: str) -> tuple[str, str]:
    """(the name to print, the text) of a file, `-` for stdin. Raises Unreadable."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        raise Unreadable(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    return ("<stdin>" if path == "-" else path), text


def documents(shown: str, text: str) -> list[tuple[yaml.Node, object]]:
    """(node, value) of each YAML document: the node keeps the lines. Raises NotYaml."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as e:  # the reader refuses a control character before parsing
        raise NotYaml(not_yaml(shown, text, e)) from None
    try:
        out = []
        while loader.check_node():
            node = loader.get_node()
            out.append((node, loader.construct_document(node)))
        return out
    except yaml.YAMLError as e:
        raise NotYaml(not_yaml(shown, text, e)) from None
    finally:
        loader.dispose()


def load(path: str) -> tuple[str, list]:
    """(the name to print, the YAML documents) of a file, `-` for stdin. Raises Unreadable, NotYaml."""
    shown, text = read(path)
    return shown, [doc for _, doc in documents(shown, text)]


def not_yaml(shown: str, text: str, e: yaml.YAMLError) -> str:
    """`FILE:LINE: not YAML: <problem>`, at the line where the parser stopped, with the start of the
    construct it was reading (PyYAML names the string, `<unicode string>`, not the file)."""
    mark = getattr(e, "problem_mark", None)
    if mark is None and isinstance(getattr(e, "position", None), int):  # a ReaderError: an offset only
        line = text.count("\n", 0, e.position) + 1
        return f"{shown}:{line}: not YAML: {str(e).splitlines()[0]}"
    if mark is None:
        return f"{shown}: not YAML: {' '.join(str(e).split())}"
    what = f"{e.problem or e.context} at column {mark.column + 1}"
    if e.context and e.context_mark is not None:
        what += f" ({e.context} at line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
    elif e.context:
        what = f"{e.context}: {what}"
    return f"{shown}:{mark.line + 1}: not YAML: {what}"


def line_of(node: yaml.Node, path) -> int:
    """The line (from 1) of the deepest field of `path` (`("spec", "dedup", 0)`) the document
    has, else the document's first. Of a key given twice the last, whose value YAML keeps."""
    line = node.start_mark.line + 1
    for step in path:
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(step)]
            if not found:
                break
            key, node = found[-1]
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            break
    return line


def field_path(problem: str) -> tuple:
    """Where a problem is: its own path (manifest.Problem), else the `spec.a[k].b: ` it opens
    with (the tenant policy's refusals), else the document."""
    if isinstance(problem, manifest.Problem):
        return problem.path
    head = re.match(r"((?:spec|metadata)(?:\.[A-Za-z0-9_]+|\[[^\]]*\])*): ", problem)
    if head is None:
        return ()
    return tuple(int(i) if i.isdigit() else i or key
                 for key, i in re.findall(r"\.?([A-Za-z0-9_]+)|\[([^\]]*)\]", head.group(1)))


def dotted(path) -> str:
    """("spec", "env", 0, "name") as the API server writes it: spec.env[0].name."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def duplicates(node: yaml.Node, path: tuple = ()) -> list[manifest.Problem]:
    """A field given twice in one mapping: YAML keeps the last silently, the API server's strict
    decoding refuses it."""
    out = []
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge" else None
            if name is not None and name in seen:
                out.append(manifest.Problem(f'duplicate field "{dotted((*path, name))}"', (*path, name)))
            seen.add(name)
            out += duplicates(value, (*path, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += duplicates(item, (*path, i))
    return out


def _label(doc, index: int) -> str:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind') or '(no kind)'}/{meta.get('name') or f'(document {index + 1})'}"


def load_policy(path: str | None) -> policy.TenantPolicy:
    """The tenant policy of `--policy`: the chart's values file (its `tenantPolicy`) or the policy
    alone; the default policy without one. Raises Unreadable (also for a policy that does not parse)."""
    if path is None:
        return policy.TenantPolicy()
    try:
        _, docs = load(path)
    except NotYaml as e:
        raise Unreadable(f"--policy {e}") from None
    try:
        doc = docs[0] if docs else None
        doc = doc.get("tenantPolicy", doc) if isinstance(doc, dict) else doc
        if doc is not None and not isinstance(doc, dict):
            raise ValueError("not a mapping")
        return policy.parse(doc)
    except ValueError as e:
        raise Unreadable(f"--policy {path}: {' '.join(str(e).split())}") from None


def problems_of(node: yaml.Node, doc: dict, tenant_policy: policy.TenantPolicy,
                allowed_registries: tuple[str, ...] = ()) -> list[str]:
    """What the API server, then the tenant policy, refuse of a document that is (or was meant
    as) a pipeline; [] if it may be applied."""
    if (wrong_kind := manifest.kind_problem(doc)) is not None:
        return [wrong_kind]
    if repeated := duplicates(node):  # a strict decoding error: the API server checks nothing more
        return repeated
    try:
        namespace = (doc.get("metadata") or {}).get("namespace")
        return policy.refusals(manifest.parse(doc).spec, tenant_policy, allowed_registries,
                               namespace if isinstance(namespace, str) else None)
    except manifest.Invalid as e:
        return e.problems


def validate(paths: list[str], out: TextIO = sys.stdout, tenant_policy: policy.TenantPolicy | None = None,
             allowed_registries: tuple[str, ...] = ()) -> int:
    """Prints `FILE: <kind>/<name>: valid` or one line per problem, `FILE:LINE: <kind>/<name>:
    <problem>`, the tenant policy's refusals among them (Secrets need a cluster: not checked);
    a file without a pipeline is a problem too. 0 if all valid, 1 if not. Raises Unreadable."""
    tenant_policy = tenant_policy or policy.TenantPolicy()
    status = VALID
    for path in paths:
        shown, text = read(path)
        try:
            docs = documents(shown, text)
        except NotYaml as e:
            print(e, file=out)
            status = INVALID
            continue
        pipelines = 0
        for i, (node, doc) in enumerate(docs):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                print(f"{shown}: document {i + 1}: skipped, not a Kubernetes object", file=out)
                continue
            label = _label(doc, i)
            if not manifest.is_pipeline(doc) and manifest.kind_problem(doc) is None:
                print(f"{shown}: {label}: skipped, not an {KIND}", file=out)
                continue
            pipelines += 1
            version = str(doc.get("apiVersion"))
            if version.removeprefix(f"{GROUP}/") in DEPRECATED_VERSIONS and version.startswith(f"{GROUP}/"):
                # Served still, as the API server would warn (kubectl prints it); not a problem.
                print(f"{shown}: {label}: Warning: {deprecation_warning(version.removeprefix(f'{GROUP}/'))}",
                      file=out)
            problems = problems_of(node, doc, tenant_policy, allowed_registries)
            for problem in problems:
                print(f"{shown}:{line_of(node, field_path(problem))}: {label}: {problem}", file=out)
            if problems:
                status = INVALID
            else:
                print(f"{shown}: {label}: valid", file=out)
        if not pipelines:  # a manifest that checks nothing is a mistake (an empty file, the wrong file)
            print(f"{shown}: no {KIND} in it", file=out)
            status = INVALID
    return status


def topics_document(names: Names, brokers: int = topics.SAFE_REPLICATION) -> dict:
    """The Kafka topics the operator creates and keeps as specified (not a Kubernetes object), on
    a cluster of `brokers` brokers: the topic plan's own replication decision."""
    made = [topics.replicated(t, brokers) for t in desired_topics(names)]
    return {"kind": "KafkaTopics",
            "metadata": {"name": names.pipeline, "namespace": names.namespace},
            "topics": [{"name": t.name, "role": t.role, "partitions": t.partitions,
                        "replicationFactor": t.replication_factor, "config": dict(t.config)} for t in made]}


# The token Secret's value in render's output: the operator writes a random token once; this one is
# refused by the operator (token_problem: not one word) if the output is applied as it is.
TOKEN_PLACEHOLDER = "replaced by a random token: the operator creates this Secret"

# The chart's defaults (charts/eopipe/values.yaml, Chart.yaml), for the Settings its operator
# runs with; tests/integration/test_render_chart.py checks them against `helm template`.
CHART_RELEASE, CHART_NAMESPACE = "eopipe", "eopipe-system"  # as docs/install.md installs it
CHART_IMAGE, CHART_SPARK_IMAGE = "eopipe", "eopipe-spark"
CHART_METRICS_NAMESPACE_SELECTOR = {"matchLabels": {access.NAMESPACE_NAME_LABEL: "monitoring"}}


def chart_version() -> str:
    """The chart's appVersion, which is the package's version (they are released together), and
    so the tag of the chart's default images."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("eopipe")
    except PackageNotFoundError:
        return "latest"


def chart_settings(release: str = CHART_RELEASE, namespace: str = CHART_NAMESPACE, *,
                   network_policy: bool = True, image: str | None = None, spark_image: str | None = None,
                   spark_driver_cluster_role: str | None = None) -> Settings:
    """The Settings of the operator the chart installs with its default values as `release` in
    `namespace`; each keyword is the value of the chart's that overrides it."""
    fullname = release if "eopipe" in release else f"{release}-eopipe"  # the chart's eopipe.fullname
    labels = {"app.kubernetes.io/name": "eopipe", "app.kubernetes.io/instance": release,
              "app.kubernetes.io/component": "operator"}  # eopipe.selectorLabels
    peers = access.PolicyPeers(namespace, tuple(sorted(labels.items())), CHART_METRICS_NAMESPACE_SELECTOR)
    return Settings(image=image or f"{CHART_IMAGE}:{chart_version()}",
                    spark_image=spark_image or f"{CHART_SPARK_IMAGE}:{chart_version()}",
                    spark_driver_cluster_role=spark_driver_cluster_role or f"{fullname}-{namespace}-spark-driver",
                    network_policy=peers if network_policy else None)


def render(pipeline: manifest.Pipeline, namespace: str, settings: Settings,
           brokers: int = topics.SAFE_REPLICATION) -> list[dict]:
    """What the operator's first reconcile pass of a new pipeline applies: the first assignment
    and replica count are the rebalance state machine's own decision for a pipeline with no
    history; the token Secret (with a placeholder), the checkpoint claim and the objects come from
    the operator's builders; then the topics, on a cluster of `brokers` brokers."""
    names = Names(namespace, pipeline.name, pipeline.spec)
    spec = pipeline.spec
    plan = rebalance.step(rebalance.Facts(now_ms=0, pod_prefix=names.dedup, replicas=spec.dedup.replicas,
                                          partitions=spec.source.partitions, paused=spec.paused,
                                          window_ms=duration_ms(spec.dedup.window)), None)
    claim = checkpoint.claim(names)
    return [access.token_secret(names, TOKEN_PLACEHOLDER), *([claim] if claim is not None else []),
            *objects(names, settings, plan.assignment, plan.replicas), topics_document(names, brokers)]


def render_file(path: str, namespace: str | None, settings: Settings, out: TextIO = sys.stdout,
                err: TextIO = sys.stderr, brokers: int = topics.SAFE_REPLICATION) -> int:
    """Prints the objects of every pipeline in the file as multi-document YAML; 1 (and the
    problems on `err`) if a pipeline is invalid. Raises Unreadable."""
    try:
        shown, docs = load(path)
    except NotYaml as e:
        print(e, file=err)
        return INVALID
    rendered, status = [], VALID
    for i, doc in enumerate(docs):
        if not manifest.is_pipeline(doc):
            continue
        try:
            pipeline = manifest.parse(doc)
        except manifest.Invalid as e:
            status = INVALID
            for problem in e.problems:
                print(f"{shown}: {_label(doc, i)}: {problem}", file=err)
            continue
        rendered += render(pipeline, namespace or pipeline.namespace or "default", settings, brokers)
    if status == VALID and not rendered:
        print(f"{shown}: no {KIND} to render", file=err)
        return INVALID
    if status == VALID:
        print(yaml.dump_all(rendered, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=100),
              end="", file=out)
    return status
