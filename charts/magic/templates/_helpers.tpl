{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "magic.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "magic.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of one component's objects: (dict "root" $ "component" "rollout") */}}
{{- define "magic.componentName" -}}
{{- printf "%s-%s" (include "magic.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "magic.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "magic.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels: (dict "root" $ "component" "rollout"); component may be empty ------------------ */}}

{{- define "magic.selectorLabels" -}}
app.kubernetes.io/name: {{ include "magic.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "magic.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "magic.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: magic
{{- end }}

{{/* The labels of a pod template: the selector labels and part-of, but neither the chart's
version nor appVersion, so that a chart bump alone restarts no pod: (dict "root" $ "component" c) */}}
{{- define "magic.podLabels" -}}
{{ include "magic.selectorLabels" . }}
app.kubernetes.io/part-of: magic
{{- end }}

{{/* Pods ---------------------------------------------------------------------------------- */}}

{{/* image reference of a component's values: (dict "root" $ "image" .Values.rollout.image) */}}
{{/* repository:tag, or repository@digest when a digest is set (the tag is then only informative:
repository:tag@digest, which the runtime pulls by digest) */}}
{{- define "magic.image" -}}
{{- $ref := printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- with .image.digest }}
{{- $ref = printf "%s@%s" $ref . }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* imagePullPolicy of an image's values: (dict "image" .Values.rollout.image); "" = IfNotPresent
when pulled by digest (immutable), Always when by tag alone (a tag can be moved) */}}
{{- define "magic.pullPolicy" -}}
{{- .image.pullPolicy | default (ternary "IfNotPresent" "Always" (ne "" (.image.digest | default ""))) }}
{{- end }}

{{/* Pod-level fields every pod shares: (dict "root" $ "values" .Values.rollout); optionally
"serviceAccountName" and "automountToken" (only the secrets hook Job talks to the API server) */}}
{{- define "magic.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ .serviceAccountName | default (include "magic.serviceAccountName" .root) }}
automountServiceAccountToken: {{ .automountToken | default false }}
securityContext:
  {{- mergeOverwrite (deepCopy .root.Values.podSecurityContext) (.values.podSecurityContext | default dict) | toYaml | nindent 2 }}
{{- with .values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with (.values.priorityClassName | default .root.Values.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with (.values.schedulerName | default .root.Values.schedulerName) }}
schedulerName: {{ . }}
{{- end }}
{{- if not (kindIs "invalid" .values.terminationGracePeriodSeconds) }}
terminationGracePeriodSeconds: {{ int .values.terminationGracePeriodSeconds }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A container's security context: the top-level one with the component's merged over it */}}
{{- define "magic.securityContext" -}}
{{- mergeOverwrite (deepCopy .root.Values.securityContext) (.values.securityContext | default dict) | toYaml }}
{{- end }}

{{/* resources with `gpus` GPUs of extended resource `name` (default nvidia.com/gpu; e.g.
amd.com/gpu, or a MIG profile nvidia.com/mig-3g.40gb) added to requests and limits:
(dict "resources" ... "gpus" n "name" resourceName) */}}
{{- define "magic.resources" -}}
{{- $r := deepCopy (.resources | default dict) }}
{{- $name := .name | default "nvidia.com/gpu" }}
{{- if gt (int .gpus) 0 }}
{{- $_ := set $r "limits" (merge (dict $name (int .gpus)) ($r.limits | default dict)) }}
{{- $_ := set $r "requests" (merge (dict $name (int .gpus)) ($r.requests | default dict)) }}
{{- end }}
{{- toYaml $r }}
{{- end }}

{{/* Settings --------------------------------------------------------------------------------- */}}

{{/* MAGIC_WEIGHT_TRANSPORT, as JSON: (dict "root" $ "learner" true|false). The learner announces
its own pod IP (expanded by Kubernetes from MAGIC_POD_IP) as the NCCL rendezvous or HTTP address. */}}
{{- define "magic.weightTransport" -}}
{{- $t := merge (dict "type" .root.Values.weightTransport) (deepCopy (.root.Values.weightTransportOptions | default dict)) }}
{{- if and .learner (eq $t.type "nccl") (not $t.master_address) }}
{{- $_ := set $t "master_address" "$(MAGIC_POD_IP)" }}
{{- end }}
{{- if and .learner (eq $t.type "http") (not $t.advertise_url) }}
{{- $_ := set $t "advertise_url" (printf "http://$(MAGIC_POD_IP):%d" (int ($t.port | default 8701))) }}
{{- end }}
{{- toJson $t }}
{{- end }}

{{- define "magic.redisHost" -}}
{{- include "magic.componentName" (dict "root" . "component" "redis") }}
{{- end }}

{{- define "magic.redisSecretName" -}}
{{- default (include "magic.componentName" (dict "root" . "component" "redis")) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "magic.apiTokenSecretName" -}}
{{- default (include "magic.componentName" (dict "root" . "component" "auth")) .Values.auth.existingSecret }}
{{- end }}

{{/* The Secret of a role's Redis ACL user: (dict "root" $ "role" "rollout") */}}
{{- define "magic.redisRoleSecretName" -}}
{{- include "magic.componentName" (dict "root" .root "component" (printf "redis-%s" .role)) }}
{{- end }}

{{- define "magic.redisAcl" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.enabled .Values.redis.acl.enabled }}true{{ end }}
{{- end }}

{{/* MAGIC_REDIS_URL as EnvVars: (dict "root" $ "role" "rollout"); with the bundled Redis's ACL
users (redis.acl.enabled) each role connects as its own user (`magic.store.acl`), else as the
default user; no role: the default user (the helm test). The password (or an external Redis's URL
Secret) is a file of the pod's `secrets` volume (magic.volumes), named by
MAGIC_REDIS_PASSWORD_FILE / MAGIC_REDIS_URL_FILE: no secret in the environment. */}}
{{- define "magic.redisEnv" -}}
{{- $root := .root }}
{{- $user := "" }}
{{- if and (include "magic.redisAcl" $root) .role }}
{{- $user = printf "magic-%s" .role }}
{{- end }}
{{- if $root.Values.redis.enabled }}
{{- if $root.Values.redis.auth.enabled }}
- name: MAGIC_REDIS_URL
  value: {{ printf "redis://%s%s:6379/0" (ternary (printf "%s@" $user) "" (ne $user "")) (include "magic.redisHost" $root) | quote }}
- name: MAGIC_REDIS_PASSWORD_FILE
  value: /var/run/secrets/magic/redis-password
{{- else }}
- name: MAGIC_REDIS_URL
  value: {{ printf "redis://%s:6379/0" (include "magic.redisHost" $root) | quote }}
{{- end }}
{{- else if $root.Values.externalRedis.existingSecret }}
- name: MAGIC_REDIS_URL_FILE
  value: /var/run/secrets/magic/redis-url
{{- else }}
- name: MAGIC_REDIS_URL
  value: {{ required "externalRedis.url or externalRedis.existingSecret is required when redis.enabled is false" $root.Values.externalRedis.url | quote }}
{{- end }}
{{- end }}

{{/* The pod's `secrets` volume: a projected volume of the Secrets its MAGIC container reads, as
files under /var/run/secrets/magic (mode 0440, readable by the pod's fsGroup): redis-password (the
role's ACL user's, or without a role the default user's: the helm test), redis-url (an external Redis's URL Secret), api-token
("token": the controller and the reward pods). Empty when there is nothing to mount.
(dict "root" $ "role" "rollout" "token" bool) */}}
{{- define "magic.secretSources" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- if and $v.redis.enabled $v.redis.auth.enabled }}
{{- if and (include "magic.redisAcl" $root) .role }}
- secret:
    name: {{ include "magic.redisRoleSecretName" . }}
    items: [{key: redis-password, path: redis-password}]
{{- else }}
- secret:
    name: {{ include "magic.redisSecretName" $root }}
    items: [{key: {{ $v.redis.auth.existingSecretPasswordKey }}, path: redis-password}]
{{- end }}
{{- else if and (not $v.redis.enabled) $v.externalRedis.existingSecret }}
- secret:
    name: {{ $v.externalRedis.existingSecret }}
    items: [{key: {{ $v.externalRedis.existingSecretUrlKey }}, path: redis-url}]
{{- end }}
{{- if .token }}
- secret:
    name: {{ include "magic.apiTokenSecretName" $root }}
    items: [{key: {{ $v.auth.existingSecretKey }}, path: api-token}]
{{- end }}
{{- with .judgeToken }}
- secret:
    name: {{ .name }}
    items: [{key: {{ .key }}, path: code-judge-token}]
{{- end }}
{{- end }}

{{/* The Secret holding the code judge's own bearer token (never the release's API token: the judge
runs untrusted code): codeJudge.tokenSecret, or one the hook Job generates for a judge deployed
with the release. {"name", "key"} as JSON */}}
{{- define "magic.codeJudgeTokenSecret" -}}
{{- $t := .Values.codeJudge.tokenSecret }}
{{- if $t.name }}
{{- toJson (dict "name" $t.name "key" ($t.key | default "api-token")) }}
{{- else }}
{{- toJson (dict "name" (include "magic.componentName" (dict "root" . "component" "codejudge-token")) "key" "api-token") }}
{{- end }}
{{- end }}

{{/* Where the reward pods send code answers: the release's code judge, or codeJudge.url */}}
{{- define "magic.codeJudgeUrl" -}}
{{- if .Values.codeJudge.enabled -}}
http://{{ include "magic.componentName" (dict "root" . "component" "codejudge") }}:{{ .Values.codeJudge.port }}
{{- else -}}
{{ .Values.codeJudge.url }}
{{- end -}}
{{- end }}

{{/* EnvVars every MAGIC container shares: (dict "root" $ "values" .Values.rollout) */}}
{{- define "magic.env" -}}
{{ include "magic.redisEnv" (dict "root" .root "role" .role) }}
{{- if and .secretFiles .token }}
- name: MAGIC_API_TOKEN_FILE
  value: /var/run/secrets/magic/api-token
{{- end }}
- name: MAGIC_DATA_DIR
  value: {{ .root.Values.persistence.mountPath | quote }}
- name: MAGIC_WORKER_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: MAGIC_POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: MAGIC_LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
- name: HOME
  value: /home/magic
- name: TMPDIR
  value: /tmp
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes ---------------------------------------------------------------------------------- */}}

{{/* The writable scratch directories of a read-only root filesystem, the shared volume, and with
"secretFiles" (and "role", "token") the Secrets as files (magic.secretSources) */}}
{{- define "magic.volumes" -}}
- name: tmp
  emptyDir: {}
{{- $sources := include "magic.secretSources" . }}
{{- if and .secretFiles $sources }}
- name: secrets
  projected:
    defaultMode: 0440
    sources:
      {{- $sources | nindent 6 }}
{{- end }}
- name: home
  emptyDir: {}
{{- if .data }}
- name: data
  persistentVolumeClaim:
    claimName: {{ default (include "magic.componentName" (dict "root" .root "component" "data")) .root.Values.persistence.existingClaim }}
{{- end }}
{{- with .shmSize }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ . }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "magic.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if and .secretFiles (include "magic.secretSources" .) }}
- name: secrets
  mountPath: /var/run/secrets/magic
  readOnly: true
{{- end }}
- name: home
  mountPath: /home/magic
{{- if .data }}
- name: data
  mountPath: {{ .root.Values.persistence.mountPath }}
{{- end }}
{{- if .shmSize }}
- name: shm
  mountPath: /dev/shm
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The port, probes and security context of a worker container (rollout, reward, learner) */}}
{{- define "magic.workerContainerCommon" -}}
securityContext:
  {{- include "magic.securityContext" . | nindent 2 }}
{{- with .values.startupProbe }}
startupProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.livenessProbe }}
livenessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.readinessProbe }}
readinessProbe:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A probe of the vLLM container: (dict "probe" values "port" n). vLLM listens on 127.0.0.1, which
the kubelet's httpGet cannot reach (it probes the pod IP): a probe given without a handler checks
GET /health from inside the container (the image's python3; no curl in vLLM's image). */}}
{{- define "magic.vllmProbe" -}}
{{- $p := deepCopy .probe }}
{{- if not (or $p.httpGet $p.exec $p.tcpSocket $p.grpc) }}
{{- $check := printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=%d)" (int .port) (int (sub ($p.timeoutSeconds | default 5) 1 | max 1)) }}
{{- $_ := set $p "exec" (dict "command" (list "python3" "-c" $check)) }}
{{- end }}
{{- toYaml $p }}
{{- end }}

{{/* ServiceMonitor on, off or auto-detected */}}
{{- define "magic.serviceMonitorEnabled" -}}
{{- $on := toString .Values.metrics.serviceMonitor.enabled }}
{{- if or (eq $on "true") (and (eq $on "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) }}true{{ end }}
{{- end }}

{{/* Secrets --------------------------------------------------------------------------------- */}}

{{/* The Secrets the chart needs but whose values are neither given in values nor in an existing
Secret: generated once, in the cluster, by the pre-install/pre-upgrade hook Job (secrets-job.yaml),
never at render time, so that two renders (helm template, Argo CD, Flux) are identical.
A list of {name, key, length}. */}}
{{- define "magic.generatedSecrets" -}}
{{- $out := list }}
{{- if and (not .Values.auth.existingSecret) (not .Values.auth.apiToken) }}
{{- $out = append $out (dict "name" (include "magic.apiTokenSecretName" .) "key" .Values.auth.existingSecretKey "length" 32) }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.auth.enabled (not .Values.redis.auth.existingSecret) (not .Values.redis.auth.password) }}
{{- $out = append $out (dict "name" (include "magic.redisSecretName" .) "key" .Values.redis.auth.existingSecretPasswordKey "length" 32) }}
{{- end }}
{{- if and .Values.codeJudge.enabled (not .Values.codeJudge.tokenSecret.name) }}
{{- $out = append $out (include "magic.codeJudgeTokenSecret" . | fromJson | merge (dict "length" 32)) }}
{{- end }}
{{- if include "magic.redisAcl" . }}
{{- range $role := list "controller" "rollout" "reward" "learner" }}
{{- if not (get ($.Values.redis.acl.passwords | default dict) $role) }}
{{- $out = append $out (dict "name" (include "magic.redisRoleSecretName" (dict "root" $ "role" $role)) "key" "redis-password" "length" 32) }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* checksum/secrets of a pod: what it reads from Secrets, as far as the chart knows it (given
values and Secret names; a generated value never changes). "token": whether the pod reads the
API token (the controller, and the reward pods for POST /v1/score). (dict "root" $ "token" bool) */}}
{{- define "magic.secretsChecksum" -}}
{{- $v := .root.Values }}
{{- $in := dict }}
{{- if not .noRedis }}
{{- $in = dict "redis" (dict "enabled" $v.redis.enabled "auth" $v.redis.auth "acl" $v.redis.acl "external" $v.externalRedis) }}
{{- end }}
{{- if .token }}
{{- $_ := set $in "auth" $v.auth }}
{{- end }}
{{- if .judgeToken }}
{{- $_ := set $in "codeJudgeToken" $v.codeJudge.tokenSecret }}
{{- end }}
{{- toJson $in | sha256sum }}
{{- end }}

{{/* NetworkPolicy pieces -------------------------------------------------------------------- */}}

{{/* A peer: the pods of this release, or of one component: (dict "root" $ "component" "rollout") */}}
{{- define "magic.podPeer" -}}
- podSelector:
    matchLabels:
      {{- include "magic.selectorLabels" . | nindent 6 }}
{{- end }}

{{/* An ingress rule for `port` from `peers`: (dict "port" p "peers" list "open" bool). Empty
peers give a rule open to every source only when "open" is true (a port that serves nothing but
metrics); otherwise no rule at all, so an empty list never opens a port that does more. */}}
{{- define "magic.ingressRule" -}}
{{- if or .peers .open }}
- ports:
    - port: {{ .port }}
  {{- with .peers }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
