{{- define "mtrl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mtrl.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mtrl.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mtrl.serviceAccountName" -}}
{{- default (include "mtrl.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "mtrl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The operator's namespaced permissions, shared by the ClusterRole and the per-namespace Roles. */}}
{{- define "mtrl.rules" -}}
# create: triggers make runs; delete: triggers prune and replace them too.
- apiGroups: [mtrl.dev]
  resources: [multiturnrlruns]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [mtrl.dev]
  resources: [multiturnrlruns/status]
  verbs: [get, patch, update]
- apiGroups: [mtrl.dev]
  resources: [multiturnrltriggers]
  verbs: [get, list, watch, patch, update]
- apiGroups: [mtrl.dev]
  resources: [multiturnrltriggers/status]
  verbs: [get, patch, update]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [sagemaker.amazonaws.com]
  resources: [hyperpodpytorchjobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, delete]
# The run's config and progress ConfigMaps. patch: the operator may only create a Role that
# grants the trainer get/patch on its progress ConfigMap if it holds those verbs itself.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, create, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end -}}
