"""Renders docs/crd-reference.md from the spec model (`python -m eopipe.control.docgen`).

The reference is generated from the same schema as the CRD (eopipe.control.crd.spec_schema, itself
from eopipe.core.spec), so field names, types, defaults, ranges, patterns and CEL rules never
drift from what the API server enforces; a test compares the committed file to render().
"""

from __future__ import annotations

import json

from eopipe.control import crd, status
from eopipe.core import manifest, spec

HEADER = """<!-- Generated from eopipe.core.spec by `python -m eopipe.control.docgen > docs/crd-reference.md`; do not edit. -->
# ExactlyOncePipeline reference

| | |
|---|---|
| API version | `{group}/{version}` (stored); also served, deprecated, with the same schema: {deprecated} |
| kind | `{kind}` (namespaced) |
| plural, short names | `{plural}`, {short} |
| CRD | `crds/{plural}.{group}.yaml` (also in the Helm chart's `crds/`) |

`kubectl get eop` shows the columns {columns}.

The API server checks everything below (types, ranges, patterns, the CEL rules) when a
manifest is applied: a bad manifest is refused by `kubectl apply` and never reaches the
operator. Durations use Go syntax (`90s`, `15m`, `24h`, `1h30m`); quantities use Kubernetes
syntax (`512Mi`, `2Gi`); Spark memory uses JVM syntax (`512m`, `2g`).
"""


def _type(node: dict) -> str:
    t = node.get("type", "")
    if t == "object" and "properties" not in node and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    if t == "array":
        return f"[]{_type(node.get('items', {}))}"
    return t or "any"


def _constraints(node: dict) -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    if "minimum" in node and "maximum" in node:
        out.append(f"{node['minimum']}..{node['maximum']}")
    elif "minimum" in node:
        out.append(f">= {node['minimum']}")
    elif "maximum" in node:
        out.append(f"<= {node['maximum']}")
    if "minLength" in node:
        out.append(f"min length {node['minLength']}")
    if "pattern" in node:
        out.append(f"pattern `{node['pattern']}`")
    values = node.get("additionalProperties")
    if isinstance(values, dict) and "pattern" in values:
        out.append(f"values match `{values['pattern']}`")
    return out


def _default(node: dict) -> str:
    if "default" not in node or node["default"] == {}:
        return ""
    return f"`{json.dumps(node['default'])}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(path: str, node: dict, out: list[str]) -> None:
    required = set(node.get("required", ()))
    out += [f"## `{path}`", ""]
    if node.get("description"):
        out += [node["description"][0].upper() + node["description"][1:] + ".", ""]
    out += ["| field | type | required | default | description |", "|---|---|---|---|---|"]
    nested = []
    for name, sub in node["properties"].items():
        desc = sub.get("description", "")
        desc = desc[0].upper() + desc[1:] if desc else ""
        parts = [p for p in [desc] + _constraints(sub) if p]
        if "properties" in sub:
            parts.append(f"see [`{path}.{name}`](#{_anchor(f'{path}.{name}')})")
            nested.append((f"{path}.{name}", sub))
        elif "properties" in sub.get("items", {}):  # a list of objects: its items' fields
            parts.append(f"see [`{path}.{name}[]`](#{_anchor(f'{path}.{name}[]')})")
            nested.append((f"{path}.{name}[]", sub["items"]))
        out.append(f"| `{name}` | {_type(sub)} | {'yes' if name in required else ''} | {_default(sub)} | "
                   f"{_cell('; '.join(parts))} |")
    out.append("")
    rules = list(node.get("x-kubernetes-validations") or [])
    for sub_name, sub in node["properties"].items():
        for r in sub.get("x-kubernetes-validations") or []:
            if "properties" not in sub:
                rules.append({**r, "field": sub_name})
    if rules:
        out += ["Rules checked by the API server:", ""]
        for r in rules:
            where = f"`{r['field']}`: " if "field" in r else ""
            out.append(f"- {where}{r['message']} (CEL `{r['rule']}`)")
        out.append("")
    for sub_path, sub in nested:
        _section(sub_path, sub, out)


def _anchor(path: str) -> str:
    return path.lower().replace(".", "").replace("[]", "")


STATUS = """## `status`

Written by the operator only (the status subresource), in the Kubernetes (kstatus)
convention; `kubectl wait --for=condition=Ready` and Argo CD (`argocd/health.lua`) read it.

| field | description |
|---|---|
| `observedGeneration` | the `metadata.generation` the status describes; conditions are stale until it catches up |
| `phase` | {phases} |
| `conditions` | list of `type`, `status` (`True`/`False`), `reason`, `message`, `observedGeneration`, `lastTransitionTime` (moves only when `status` flips) |
| `topics` | the Kafka topics by role: `source`, `deduped`, `dead-letter` (and `sink`, `spark-commits` with a processing stage) |
| `ownedTopics` | the topics the operator created for this pipeline, recorded once the create call succeeded: only these are ever altered (partitions grown, config drift reverted) or deleted (`deletionPolicy: Delete`). A topic that existed before the pipeline is adopted: checked, never changed or deleted |
| `topicChanges` | what the last pass changed on the topics (created, partitions added, configs set) |
| `assignment` | the live partition assignment: `generation` and, per dedup pod, its partitions |
| `replicas`, `readyReplicas` | dedup pods wanted and ready |
| `lag` | `dedup`: source records the dedup stage has not committed yet, summed over partitions as the workers report them (every few seconds); the `LAG` column of `kubectl get eop` |
| `selector` | label selector of the dedup pods (the scale subresource's, for an HPA or KEDA) |
| `partitions` | source partitions |
| `effectiveWindow` | the window the dedup state really covers, as the workers report it: `spec.dedup.window`, or less after a rebuild from a source whose retention had already dropped part of it; duplicates further apart are not caught |
| `dedupStats` | what the dedup pods report (`/status`): `stateKeys` and `stateBytes` of the RocksDB state over the running partitions; `records`, the records the pods committed since each started (`consumed`, `emitted`, `duplicates`, `deadLettered`); `perSecond`, the same per second between two samples at least 5 s apart (a restarted pod counts from zero); `sampledAtMs` and `pods`, the sample the next rates start from. The worker metrics (`eopipe_dedup_*`) have the same per partition |
| `sparkApplicationState` | the SparkApplication's state, when there is a processing stage |
| `sparkCheckpoint` | the Spark checkpoint the driver is given: `generation` (0: `processing.checkpoint` itself; n: its `generation-<n>` subdirectory, which `upgradeMode` fromSink or reprocess started) and `query`, a digest of the query that generation was started for (docs/upgrades.md) |
| `sparkStall` | set while the Spark stage is Stalled (a spec Spark cannot analyse, or a checkpoint it refused): `reason`, `message` and `spec`, a digest of the SparkApplication it holds for (its uid and the digest of its spec its pods carry, label `eopipe.dev/spark-spec`); the pipeline stays Stalled, even while the Spark Operator runs its one retry, until the spec changes or the SparkApplication is deleted |
| `sparkResubmits` | set while the Spark application keeps failing after the Spark Operator's own retries: `count`, the operator's resubmissions since a submission last ran 10 minutes (then it is cleared), `last` (when) and `spec` (the digest of the spec they were for: a changed spec starts again). The first resubmission is at once, each next one waits longer (30 s doubling to 5 minutes; a Warning event `SparkResubmitted` each) |
| `processing` | what the running Spark driver reports of its query (`GET /progress` on port 4045, read each pass): `lastBatchId`, `lastBatchTime` (when it ended), `batchDurationMs`, `inputRowsPerSecond` and `processedRowsPerSecond` (Spark's own), `stateRows` and `stateBytes` (summed over the stateful operators), and `lagRecords`: per partition of the deduped topic its last stable offset minus the offset the last batch read up to, summed (the `SPARK LAG` column of `kubectl get eop -o wide`; `BATCH` is `lastBatchId`); `error` when the driver or Kafka did not answer the last pass (the figures are then the last read) |
| `rebalance` | present while partitions move between pods or the partition count grows: `id`, `type` (`replicas` or `partitions`), `phase` (`ScalingUp`, `HandingOff`, `Pausing`, `CreatingPartitions`, `Resharding`, `Finalizing`), `fromReplicas`/`toReplicas`, `fromPartitions`/`toPartitions`, `startedAt`, `message`, `targetGeneration` and `target` (the assignment being published), and `moves`: per partition `from`, `to` and, once it runs at its new owner, `method` (`snapshot`, `rebuild`, `local`, `reshard-import`), `bytes`, `keys`, `pauseMs`. The operator resumes a rebalance from here after a restart |
| `lastRebalance` | summary of the last finished rebalance: from/to replicas and partitions, `partitionsMoved`, `snapshot` and `rebuild` counts, `bytesMoved`, `keysMoved`, `maxPauseMs` (per handoff) or `pauseMs` (the whole re-shard pause), `rebuilt` partitions, `startedAt`, `finishedAt`, `durationSeconds` |
| `restores` | per partition, the last restore from the object store a dedup pod reported (`spec.dedup.backup`: its state was gone and came back from a snapshot): `pod`, `snapshotOffset`, `replayed` (records replayed from the snapshot's offset), `seconds`. Each new one is told once by a `StateRestored` event |
| `lastNodeLoss` | the last time the operator acted on a lost node (docs/design.md#node-loss): `at`, `nodes`, `pods` force-deleted, `claims` deleted (each also a Warning event `NodeLost`) |

### Conditions

| type | meaning |
|---|---|
| `Ready` | the pipeline processes records; reason `Running` (or `Rebalancing`, still True), else the reason of the first stage that is not ready, `Paused`, or the stall reason |
| `Reconciling` | the operator is moving towards the spec (reason `Progressing`); `Settled` when not |
| `Stalled` | the operator cannot go on without a change of the spec (reasons `InvalidSpec`, `NotSupported`, `Conflict`: an older pipeline writes one of this one's topics) |
{stages}

Reasons of the stage conditions and what to do: [troubleshooting.md](troubleshooting.md).
"""

STAGE_MEANING = {
    "TopicsReady": "the source, deduped and dead-letter topics (and the sink topic) exist as specified; "
                   "`AdoptedTopicMismatch`: a topic eopipe did not create lacks what the pipeline needs "
                   "(the message gives the command that fixes it)",
    "DedupReady": "the dedup StatefulSet's pods are ready",
    "ProcessingReady": "the SparkApplication runs (True with reason `NotConfigured` for a dedup-only pipeline); "
                       "`SparkStuck`: no batch for 10 triggers (at least 60 s) while the deduped topic holds "
                       "records the query has not read (`status.processing`); `CheckpointUnreachable`: the "
                       "checkpoint's store (an object store, a volume) has not answered the driver for 10 s; "
                       "`DriverNodeLost`: the driver's node is lost (its taint out-of-service moves it)",
}


def render() -> str:
    c = crd.crd()
    version = c["spec"]["versions"][0]
    cols = version["additionalPrinterColumns"]
    columns = ", ".join(col["name"] for col in cols if not col.get("priority"))
    wide = [col["name"] for col in cols if col.get("priority")]
    columns += f"; `-o wide` adds {', '.join(wide)}" if wide else ""
    out = [HEADER.format(group=spec.GROUP, version=spec.VERSION, kind=spec.KIND, plural=spec.PLURAL,
                         deprecated=", ".join(f"`{spec.GROUP}/{v}`" for v in spec.DEPRECATED_VERSIONS),
                         short=", ".join(f"`{s}`" for s in c["spec"]["names"]["shortNames"]),
                         columns=columns)]
    lines = ["## `metadata.name`", "", "A DNS-1123 subdomain, as for every object, and more: the pipeline's "
             "name is part of the names of the objects the operator creates. Rules checked by the API server:",
             "", *(f"- {r['message']} (CEL `{r['rule']}`)" for r in manifest.ROOT_RULES), ""]
    _section("spec", crd.spec_schema(), lines)
    out.append("\n".join(lines))
    phases = "`Provisioning`, `Running`, `Rebalancing`, `Paused` or `Failed`"
    stages = "\n".join(f"| `{t}` | {STAGE_MEANING[t]} |" for t in status.STAGES)
    out.append(STATUS.format(phases=phases, stages=stages))
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
