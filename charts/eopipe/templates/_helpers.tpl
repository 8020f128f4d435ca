{{/* Names and labels (nameOverride, fullnameOverride: the usual Helm pattern). */}}
{{- define "eopipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eopipe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "eopipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eopipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "eopipe.labels" -}}
{{ include "eopipe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "eopipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "eopipe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "eopipe.leaseName" -}}
{{- printf "%s-leader" (include "eopipe.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Spark drivers' ClusterRole (rbac.yaml), which the operator binds per pipeline. */}}
{{- define "eopipe.sparkDriverClusterRole" -}}
{{- printf "%s-%s-spark-driver" (include "eopipe.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "eopipe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "eopipe.sparkImage" -}}
{{- printf "%s:%s" .Values.sparkImage.repository (default .Chart.AppVersion .Values.sparkImage.tag) -}}
{{- end -}}

{{/*
What the operator does in a namespace it watches (see operator/eopipe/control: handlers.py,
reconcile.py, kube.py; core/kafkaconf.py). Server-side apply of a missing object is a PATCH that
creates, which the API server authorizes as both patch and create.
*/}}
{{- define "eopipe.namespacedRules" -}}
# The custom resource: watched by Kopf, patched for its finalizer and handler progress.
- apiGroups: [eopipe.dev]
  resources: [exactlyoncepipelines]
  verbs: [get, list, watch, patch]
- apiGroups: [eopipe.dev]
  resources: [exactlyoncepipelines/status]
  verbs: [patch]
# Owner references with blockOwnerDeletion (clusters with OwnerReferencesPermissionEnforcement).
- apiGroups: [eopipe.dev]
  resources: [exactlyoncepipelines/finalizers]
  verbs: [update]
# Children, applied server-side: assignment ConfigMap, headless Service, PDB, StatefulSet,
# SparkApplication.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, create, patch]
# Watched (list, watch): a change of its ready pods reconciles the pipeline (control/sparkwatch.py).
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
# Deleted while the pipeline is paused (its driver stops), created again on resume; watched
# (list, watch) so that a change of its state reconciles the pipeline (control/sparkwatch.py).
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, list, watch, create, patch, delete]
# The dedup pods' ServiceAccount, Role and RoleBinding (builders/dedup.py rbac), the Spark
# driver's ServiceAccount and RoleBinding (builders/spark.py driver_rbac).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch]
# The dedup pods' Role grants get/list/watch of their assignment ConfigMap, which RBAC only
# lets the operator grant if it holds it too: reads, nothing more.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list, watch]
# The Spark driver's rights are the chart's ClusterRole: the operator may bind that one
# (RoleBinding in the pipeline's namespace) and holds none of its rights.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  resourceNames: [{{ include "eopipe.sparkDriverClusterRole" . }}]
  verbs: [bind]
# The Spark checkpoint claim (builders/checkpoint.py), applied server-side.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch]
# The dedup pods (observe.py reads their /status), and the Spark driver pods (sparkstage.py);
# delete: node loss (control/nodeloss.py) force-deletes a dedup pod stuck on a lost node, by uid.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, delete]
# Node loss: a dedup pod's claim pinned to a lost node is deleted (by uid) for a new one; a
# deleted pipeline's dedup state claims, listed by label, deleted by uid (control/teardown.py).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [list, delete]
# Kafka credentials named by spec.kafka.sasl / spec.kafka.tls Secret references (read); the
# pipeline's state-endpoint token Secret (control/tokens.py: created once, then read). RBAC
# cannot name the object of a create: `create` is for that Secret, which nothing else can make
# (an apply would rotate its random token).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# The dedup pods' NetworkPolicy (builders/access.py), applied server-side.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
# Events about every transition (Kopf posts them through the core API).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/*
Cluster-scoped reads the operator needs in every mode: Kopf observes CRDs, and it lists and
watches namespaces even when given exact names (without it, Kopf retries for about a minute,
then falls back to assuming the named namespaces exist, logging 403s all along); node loss
reads Nodes and PersistentVolumes by name.
*/}}
{{- define "eopipe.kopfClusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
# Node loss (control/nodeloss.py): the Ready condition and the cordon of the dedup pods' nodes
# (a cordon watched: a drain waits for the operator) and whether a claim's volume is pinned to
# one node, read by name.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get]
{{- end -}}

{{/* A JSON list of anchored regular expressions of globs whose only wildcard is `*`
(control/policy.py glob_regex), for the admission policy's CEL. */}}
{{- define "eopipe.globRegexes" -}}
{{- $out := list -}}
{{- range . -}}
{{- $out = append $out (printf "^%s$" (regexQuoteMeta . | replace "\\*" ".*")) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The node selector terms of a nodeAffinity (CEL, the path given): the required terms and the
preferred ones' preferences, in one list. Free-form (the CRD keeps affinity as given).
*/}}
{{- define "eopipe.nodeTerms" -}}
(has({{ . }}.requiredDuringSchedulingIgnoredDuringExecution) && has({{ . }}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) ? {{ . }}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms : []) + (has({{ . }}.preferredDuringSchedulingIgnoredDuringExecution) ? {{ . }}.preferredDuringSchedulingIgnoredDuringExecution.filter(w, has(w.preference)).map(w, w.preference) : [])
{{- end -}}

{{/* CEL: every matchExpressions and matchFields key of the terms in variable . is an allowed nodeSelector key. */}}
{{- define "eopipe.termKeysAllowed" -}}
variables.{{ . }}.all(t, (!has(t.matchExpressions) || t.matchExpressions.all(e, variables.nodeSelectorKeys.exists(r, string(e.key).matches(r)))) && (!has(t.matchFields) || t.matchFields.all(e, variables.nodeSelectorKeys.exists(r, string(e.key).matches(r)))))
{{- end -}}
