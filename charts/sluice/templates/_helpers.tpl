{{/*
Shared helpers: names, labels, images, addresses and the pieces every Sluice pod has in common.
Component helpers take a dict: (dict "ctx" $ "component" "broker"). `component` is the name used in
resource names and labels (broker, coordinator, offset-store, dispatcher, redis); "sluice.values"
maps it to its values block (components.offsetStore for offset-store).
*/}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or just <release> when it already contains the chart name. */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <fullname>-<component>; components keep names short enough for StatefulSet pod names. */}}
{{- define "sluice.componentName" -}}
{{- printf "%s-%s" (include "sluice.fullname" .ctx) .component | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The values block of a component. */}}
{{- define "sluice.valuesKey" -}}
{{- .component | replace "-" "_" | camelcase | untitle }}
{{- end }}

{{/* Labels on every resource. Optional "component" adds app.kubernetes.io/component. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" .ctx }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: sluice
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels a Service, Deployment or StatefulSet selects on; never change them after install. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* The image of a component: its override, else the global Sluice image. Digest wins over tag. */}}
{{- define "sluice.image" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- $repo := default .ctx.Values.image.repository $c.image.repository }}
{{- if and (not $c.image.tag) .ctx.Values.image.digest }}
{{- printf "%s@%s" $repo .ctx.Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default (default .ctx.Chart.AppVersion .ctx.Values.image.tag) $c.image.tag) }}
{{- end }}
{{- end }}

{{- define "sluice.imagePullPolicy" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- default .ctx.Values.image.pullPolicy $c.image.pullPolicy }}
{{- end }}

{{/* In-cluster addresses (host:port) the services give each other. */}}
{{- define "sluice.coordinatorAddress" -}}
{{- printf "%s:%d" (include "sluice.componentName" (dict "ctx" . "component" "coordinator")) (int .Values.components.coordinator.service.port) }}
{{- end }}

{{- define "sluice.offsetStoreAddress" -}}
{{- printf "%s:%d" (include "sluice.componentName" (dict "ctx" . "component" "offset-store")) (int .Values.components.offsetStore.service.port) }}
{{- end }}

{{/* What the Redis start-up scripts need to find the primary (redis/configmap.yaml, find-primary.sh). */}}
{{- define "sluice.redisSentinelEnv" -}}
{{- $r := .ctx.Values.components.redis -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: HEADLESS_SERVICE
  value: {{ printf "%s.%s.svc.%s" .headless .ctx.Release.Namespace .ctx.Values.clusterDomain | quote }}
- name: STATEFULSET
  value: {{ include "sluice.componentName" (dict "ctx" .ctx "component" "redis") | quote }}
- name: REDIS_REPLICAS
  value: {{ $r.replicas | quote }}
- name: REDIS_PORT
  value: {{ $r.service.port | quote }}
- name: SENTINEL_PORT
  value: {{ $r.sentinel.port | quote }}
- name: MASTER_NAME
  value: {{ $r.sentinel.masterName | quote }}
{{- end }}

{{- define "sluice.brokerHeadlessName" -}}
{{- printf "%s-headless" (include "sluice.componentName" (dict "ctx" . "component" "broker")) }}
{{- end }}

{{/* Where the Redis URL lives: a Secret name and key. */}}
{{- define "sluice.redisUrlSecretName" -}}
{{- if .Values.components.redis.enabled }}
{{- include "sluice.componentName" (dict "ctx" . "component" "redis") }}
{{- else if .Values.externalRedis.existingSecret }}
{{- .Values.externalRedis.existingSecret }}
{{- else }}
{{- printf "%s-external-redis" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{- define "sluice.redisUrlSecretKey" -}}
{{- if and (not .Values.components.redis.enabled) .Values.externalRedis.existingSecret }}
{{- .Values.externalRedis.existingSecretKey }}
{{- else }}
{{- "redis-url" }}
{{- end }}
{{- end }}

{{/*
Env that gives a service its Redis URL as SLUICE_REDIS_URL (the args pass it with --redis-url=$(SLUICE_REDIS_URL),
so the URL, which may hold a password, never appears in the pod spec).
*/}}
{{- define "sluice.redisEnv" -}}
- name: SLUICE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.redisUrlSecretName" . }}
      key: {{ include "sluice.redisUrlSecretKey" . }}
{{- end }}

{{/* Downward-API env every Sluice container gets: who and where it is. */}}
{{- define "sluice.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/* The listen flags every Sluice service takes. */}}
{{- define "sluice.listenArgs" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
- {{ .component }}
- --host=0.0.0.0
- --port={{ $c.service.port }}
- --metrics-port={{ $c.metrics.port }}
- --config=/etc/sluice/{{ .component }}.toml
{{- end }}

{{/* Pod-level settings every component shares (scheduling, security, grace period). */}}
{{- define "sluice.podCommon" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{ end -}}
securityContext:
  {{- toYaml $c.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $c.terminationGracePeriodSeconds }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $c.affinity }}
affinity:
  {{- toYaml $c.affinity | nindent 2 }}
{{- else if has (dig "antiAffinity" "none" $c) (list "soft" "hard") }}
{{- /* Replicas of a partition on one node would fail together: spread the pods across nodes. */}}
affinity:
  podAntiAffinity:
    {{- if eq $c.antiAffinity "hard" }}
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "sluice.selectorLabels" . | nindent 12 }}
    {{- else }}
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "sluice.selectorLabels" . | nindent 14 }}
    {{- end }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod metadata: labels (selector + podLabels) and annotations (checksum/config + podAnnotations). */}}
{{- define "sluice.podMetadata" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
labels:
  {{- include "sluice.labels" . | nindent 2 }}
  {{- with $c.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ .checksum }}
  {{- /* Restart on a Redis address or password change (a generated password is kept across upgrades). */}}
  checksum/redis: {{ toJson (list .ctx.Values.externalRedis .ctx.Values.components.redis.enabled .ctx.Values.components.redis.auth) | sha256sum }}
  {{- with $c.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The image, security and resources part of a component's main container. */}}
{{- define "sluice.containerCommon" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
image: {{ include "sluice.image" . | quote }}
imagePullPolicy: {{ include "sluice.imagePullPolicy" . }}
securityContext:
  {{- toYaml $c.securityContext | nindent 2 }}
resources:
  {{- toYaml $c.resources | nindent 2 }}
{{- end }}

{{/* Named container ports of a Sluice service (and the broker's and dispatcher's wire port). */}}
{{- define "sluice.containerPorts" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
- name: grpc
  containerPort: {{ $c.service.port }}
  protocol: TCP
{{- with $c.wire }}
- name: wire
  containerPort: {{ .port }}
  protocol: TCP
{{- end }}
- name: metrics
  containerPort: {{ $c.metrics.port }}
  protocol: TCP
{{- end }}

{{/*
Service ports of a Sluice service: gRPC, the broker's and dispatcher's wire port (plain TCP, Sluice's
framed binary protocol, so no appProtocol) and metrics. The client and headless Services share them.
*/}}
{{- define "sluice.servicePorts" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
- name: grpc
  port: {{ $c.service.port }}
  targetPort: grpc
  protocol: TCP
  appProtocol: grpc
{{- with $c.wire }}
- name: wire
  port: {{ .port }}
  targetPort: wire
  protocol: TCP
{{- end }}
- name: metrics
  port: {{ $c.metrics.port }}
  targetPort: metrics
  protocol: TCP
  appProtocol: http
{{- end }}

{{/*
Probes through the standard gRPC health service (grpc.health.v1, service ""), which every Sluice
service serves on its main port and turns NOT_SERVING on SIGTERM. The startup probe gives slow
starts (a broker recovering its log) their own budget so liveness can stay strict.
*/}}
{{- define "sluice.grpcProbes" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- if $c.probes.enabled -}}
startupProbe:
  grpc:
    port: {{ $c.service.port }}
  periodSeconds: 5
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.startupFailureThreshold }}
readinessProbe:
  grpc:
    port: {{ $c.service.port }}
  periodSeconds: {{ $c.probes.periodSeconds }}
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.failureThreshold }}
livenessProbe:
  grpc:
    port: {{ $c.service.port }}
  periodSeconds: {{ $c.probes.periodSeconds }}
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.failureThreshold }}
{{- end }}
{{- end }}

{{/* Mounts every Sluice container has: its config file and a writable /tmp (the root filesystem is read-only). */}}
{{- define "sluice.commonVolumeMounts" -}}
- name: config
  mountPath: /etc/sluice
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "sluice.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "sluice.componentName" . }}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end }}

{{/* A component's config ConfigMap: its `config` map as TOML, read with --config. */}}
{{- define "sluice.configMap" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
data:
  {{ .component }}.toml: |
    # Rendered from components.{{ include "sluice.valuesKey" . }}.config; flags and env override it.
    {{- with $c.config }}
    {{- toToml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* A component's client Service with its gRPC (and wire) and metrics ports. */}}
{{- define "sluice.service" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
    sluice.dev/scrape: "true"
  {{- with $c.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ $c.service.type }}
  selector:
    {{- include "sluice.selectorLabels" . | nindent 4 }}
  ports:
    {{- include "sluice.servicePorts" . | nindent 4 }}
{{- end }}

{{/* "true" when a PDB bound is set: 0 counts, "" and null do not. Empty output means unset. */}}
{{- define "sluice.pdbValueSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") }}true{{ end }}
{{- end }}

{{/* A component's PodDisruptionBudget. */}}
{{- define "sluice.pdb" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- if and $c.enabled $c.podDisruptionBudget.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "sluice.componentName" . }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
spec:
  {{- if include "sluice.pdbValueSet" $c.podDisruptionBudget.minAvailable }}
  minAvailable: {{ $c.podDisruptionBudget.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $c.podDisruptionBudget.maxUnavailable }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "sluice.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{- define "sluice.coordinatorServiceAccountName" -}}
{{- $sa := .Values.components.coordinator.serviceAccount }}
{{- if $sa.create }}
{{- default (include "sluice.componentName" (dict "ctx" . "component" "coordinator")) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{- define "sluice.leaseName" -}}
{{- default (include "sluice.componentName" (dict "ctx" . "component" "coordinator")) .Values.components.coordinator.election.leaseName }}
{{- end }}
