{{- define "mtrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, or <release>-<name> unless the release's name
already contains it (KubeRay's and helm create's convention). */}}
{{- define "mtrl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "mtrl.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mtrl.labels" -}}
app.kubernetes.io/name: {{ include "mtrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "mtrl.selector" -}}
app.kubernetes.io/name: {{ include "mtrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mtrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mtrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The user name the API server gives the operator's requests (what RBAC and the admission
policy match). */}}
{{- define "mtrl.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "mtrl.serviceAccountName" .) -}}
{{- end -}}

{{- define "mtrl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The leader-election Lease (the operator names it mtrl-operator-<operator id>). */}}
{{- define "mtrl.leaseName" -}}
{{- $name := printf "mtrl-operator-%s" .Values.operator.id -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$" $name) -}}
{{- fail (printf "leaderElection: the Lease %q is not a valid object name; use an operator.id of lower-case letters, digits, '-' and '.'" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The operator pod's and the cleanup hook's pod settings shared by both. */}}
{{- define "mtrl.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The operator's namespaced permissions, shared by the ClusterRole and the per-namespace
Roles: exactly the calls the operator makes (operator/mtrl_operator/adapters/kube.py, the
controllers' watches, kopf's watches and Events). The admission policy narrows the writes further
to objects the operator owns. */}}
{{- define "mtrl.rules" -}}
# Runs: kopf lists and watches them; finalizers and status are patched; triggers create runs
# and prune old ones; a finished run with a TTL is deleted.
- apiGroups: [mtrl.dev]
  resources: [multiturnrlruns]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [mtrl.dev]
  resources: [multiturnrlruns/status, multiturnrltriggers/status]
  verbs: [patch]
- apiGroups: [mtrl.dev]
  resources: [multiturnrltriggers]
  verbs: [get, list, watch, patch]
# Children carry ownerReferences with blockOwnerDeletion; where the OwnerReferencesPermission-
# Enforcement admission plugin runs (OpenShift, some hardened clusters) that needs update on
# the owner's finalizers.
- apiGroups: [mtrl.dev]
  resources: [multiturnrlruns/finalizers, multiturnrltriggers/finalizers]
  verbs: [update]
# Trainer workloads: get is a live read of the current attempt's workload before a run's
# phase is decided on it (a cache may lag).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [sagemaker.amazonaws.com]
  resources: [hyperpodpytorchjobs]
  verbs: [get, list, watch, create, delete]
# Why Kueue holds a trainer: its Workload's conditions (read while the trainer is suspended).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, delete]
# The run's config and progress ConfigMaps (deleted with the run by the garbage collector).
# get and patch: Kubernetes lets the operator create a Role granting the trainer get/patch on
# its progress ConfigMap only if it holds those verbs itself.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch]
# The runs' pods, watched (label-selected): a failed trainer's termination message (its own
# words), a pending trainer's scheduling, crash-looping workers; and the failed container's log
# tail, kept in a ConfigMap before the workload goes.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
# The trainer's rendezvous Service (Job launcher), deleted by its name (the Job's).
- apiGroups: [""]
  resources: [services]
  verbs: [create, delete]
# The progress channel's Role and RoleBinding (deleted with the run by the garbage collector).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* pricing as MTRL_INSTANCE_PRICES: type=usd,type=usd (sorted by type) */}}
{{- define "mtrl.instancePrices" -}}
{{- $items := list }}
{{- range $type, $usd := .Values.pricing }}
{{- $items = append $items (printf "%s=%v" $type $usd) }}
{{- end }}
{{- join "," $items }}
{{- end }}
