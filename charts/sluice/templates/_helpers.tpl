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

{{/* The headless Service giving each pod of a StatefulSet (broker, coordinator, dispatcher) a DNS name. */}}
{{- define "sluice.headlessName" -}}
{{- printf "%s-headless" (include "sluice.componentName" .) }}
{{- end }}

{{- define "sluice.brokerHeadlessName" -}}
{{- include "sluice.headlessName" (dict "ctx" . "component" "broker") }}
{{- end }}

{{/*
The host a pod advertises (--advertised-host): its own name under the component's headless Service,
<pod>.<fullname>-<component>-headless.<namespace>.svc.<clusterDomain>. A stable DNS name, not the pod IP,
because with TLS the peers verify the certificate against the name they dial, and a certificate issued
ahead of time can name the pods (a wildcard under the headless Service) but never their IPs.
*/}}
{{- define "sluice.advertisedHost" -}}
{{- printf "$(POD_NAME).%s.$(POD_NAMESPACE).svc.%s" (include "sluice.headlessName" .) .ctx.Values.clusterDomain }}
{{- end }}

{{/* A component's headless Service: per-pod DNS names, published before the pods are ready. */}}
{{- define "sluice.headlessService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "sluice.headlessName" . }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "sluice.labels" . | nindent 4 }}
spec:
  type: ClusterIP
  clusterIP: None
  # Resolve a pod's name while it starts: peers and clients learn it (Metadata, the Lease) before it is ready.
  publishNotReadyAddresses: true
  selector:
    {{- include "sluice.selectorLabels" . | nindent 4 }}
  ports:
    {{- include "sluice.servicePorts" . | nindent 4 }}
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
Env that gives a service its Redis URL as its own setting, SLUICE_<SERVICE>_REDIS_URL, read by the config
loader: the URL holds a password, so it stays out of the pod spec and out of the process's command line
(a --redis-url=$(VAR) flag would put it in /proc/<pid>/cmdline, which ps shows).
*/}}
{{- define "sluice.redisEnv" -}}
- name: {{ include "sluice.envPrefix" . }}REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "sluice.redisUrlSecretName" .ctx }}
      key: {{ include "sluice.redisUrlSecretKey" .ctx }}
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
{{- with .Values.mallocArenaMax }}
- name: MALLOC_ARENA_MAX
  value: {{ . | quote }}
{{- end }}
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
{{- with (dig "priorityClassName" "" $c) }}
priorityClassName: {{ . | quote }}
{{- end }}
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
{{- if $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml $c.topologySpreadConstraints | nindent 2 }}
{{- else if has (dig "zoneSpread" "none" $c) (list "soft" "hard") }}
{{- /* Replicas spread across zones survive a zone's loss; soft still schedules in a one-zone cluster. */}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: {{ if eq $c.zoneSpread "hard" }}DoNotSchedule{{ else }}ScheduleAnyway{{ end }}
    labelSelector:
      matchLabels:
        {{- include "sluice.selectorLabels" . | nindent 8 }}
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
{{- $check := include "sluice.probeCheck" . }}
startupProbe:
  {{- $check | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.startupFailureThreshold }}
readinessProbe:
  {{- $check | nindent 2 }}
  periodSeconds: {{ $c.probes.periodSeconds }}
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.failureThreshold }}
livenessProbe:
  {{- $check | nindent 2 }}
  periodSeconds: {{ $c.probes.periodSeconds }}
  timeoutSeconds: {{ $c.probes.timeoutSeconds }}
  failureThreshold: {{ $c.probes.failureThreshold }}
{{- end }}
{{- end }}

{{/*
What a probe checks. Plaintext: the gRPC health service on the main port. With TLS the kubelet's gRPC
probe cannot do TLS (and sends no credentials), so by default (tls.probes: httpGet) it asks the service's
own /healthz on the metrics port (sluice/server/http.py: 200 while the gRPC health is SERVING, 503
otherwise), over HTTPS when tls.metrics serves that port with TLS (the kubelet does not verify the
certificate). tcpSocket only sees that the gRPC port accepts connections.
*/}}
{{- define "sluice.probeCheck" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- $tls := .ctx.Values.tls -}}
{{- if not $tls.enabled -}}
grpc:
  port: {{ $c.service.port }}
{{- else if eq $tls.probes "tcpSocket" -}}
tcpSocket:
  port: grpc
{{- else -}}
httpGet:
  path: /healthz
  port: metrics
  scheme: {{ if $tls.metrics }}HTTPS{{ else }}HTTP{{ end }}
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
    # Rendered from components.{{ include "sluice.valuesKey" . }}.limits and .config; flags and env override it.
    {{- $config := $c.config | default dict }}
    {{- range $key, $value := ($c.limits | default dict) }}
    {{- if not (hasKey $config $key) }}
    {{- /* Whole numbers as integers: values may arrive as floats, and an integer setting refuses 1000.0. */}}
    {{ $key }} = {{ if and (kindIs "float64" $value) (eq (floor $value) $value) }}{{ int64 $value }}{{ else }}{{ $value }}{{ end }}
    {{- end }}
    {{- end }}
    {{- with $config }}
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

{{/*
The ServiceAccount a component's pods run as. The coordinator's is configurable (election RBAC); the
broker, offset store and dispatcher each have their own, `<fullname>-<component>`, always created, so
RBAC granted to Sluice (TokenReview's system:auth-delegator) never lands on the namespace's `default`.
*/}}
{{- define "sluice.serviceAccountName" -}}
{{- if eq .component "coordinator" }}
{{- include "sluice.coordinatorServiceAccountName" .ctx }}
{{- else }}
{{- include "sluice.componentName" . }}
{{- end }}
{{- end }}

{{- define "sluice.leaseName" -}}
{{- default (include "sluice.componentName" (dict "ctx" . "component" "coordinator")) .Values.components.coordinator.election.leaseName }}
{{- end }}

{{/* ---- Security (docs/security.md, "Kubernetes") ---------------------------------------------- */}}

{{/* Where the security files are mounted in every Sluice container (never under the /etc/sluice ConfigMap). */}}
{{- define "sluice.tlsDir" -}}/var/run/secrets/sluice/tls{{- end }}
{{- define "sluice.clusterTokenDir" -}}/var/run/secrets/sluice/cluster{{- end }}
{{- define "sluice.kubernetesSADir" -}}/var/run/secrets/kubernetes.io/serviceaccount{{- end }}

{{/* The env prefix of a service's settings (sluice.server.config): SLUICE_OFFSET_STORE_ for offset-store. */}}
{{- define "sluice.envPrefix" -}}
{{- printf "SLUICE_%s_" (.component | upper | replace "-" "_") }}
{{- end }}

{{/* The Secret holding a component's certificate: its own, the shared one, else cert-manager's. */}}
{{- define "sluice.tlsSecretName" -}}
{{- $key := include "sluice.valuesKey" . }}
{{- $tls := .ctx.Values.tls }}
{{- default (default (printf "%s-tls" (include "sluice.componentName" .)) $tls.existingSecret) (index $tls.componentSecrets $key) }}
{{- end }}

{{/* "true" when the chart renders cert-manager resources: the API is there (or forced). */}}
{{- define "sluice.certManager" -}}
{{- if or .Values.tls.certManager.force (.Capabilities.APIVersions.Has "cert-manager.io/v1") }}true{{ end }}
{{- end }}

{{/*
The Secret clients take the CA from (key ca.crt; mount that key only, with `items`, since the Secret also
holds a private key): the shared existing Secret, the chart's own CA, or the coordinator's certificate
(cert-manager writes the issuing CA into ca.crt of each certificate's Secret).
*/}}
{{- define "sluice.caSecretName" -}}
{{- $tls := .Values.tls }}
{{- if $tls.existingSecret }}
{{- $tls.existingSecret }}
{{- else if and (not $tls.certManager.issuerRef.name) (not (index $tls.componentSecrets "coordinator")) }}
{{- printf "%s-ca" (include "sluice.fullname" .) }}
{{- else }}
{{- include "sluice.tlsSecretName" (dict "ctx" . "component" "coordinator") }}
{{- end }}
{{- end }}

{{/* The cluster token's Secret (key `token`): an existing one, or the chart's. */}}
{{- define "sluice.clusterTokenSecretName" -}}
{{- default (printf "%s-cluster-token" (include "sluice.fullname" .)) .Values.auth.clusterToken.existingSecret }}
{{- end }}

{{/* "true" when the services fetch the Kubernetes API server's JWKS (they need a ServiceAccount token). */}}
{{- define "sluice.kubernetesJwks" -}}
{{- $a := .Values.auth }}
{{- if and $a.enabled (has "jwt" $a.mechanisms) $a.jwt.kubernetesCA }}true{{ end }}
{{- end }}

{{/* "true" when the services ask the TokenReview API about each token (in-cluster: the pod's own token). */}}
{{- define "sluice.tokenReview" -}}
{{- $a := .Values.auth }}
{{- if and $a.enabled (has "jwt" $a.mechanisms) $a.jwt.tokenReview.enabled }}true{{ end }}
{{- end }}

{{/*
Security env of a Sluice service: exactly the SecuritySettings fields (sluice/security/settings.py), as
SLUICE_<SERVICE>_<FIELD>; tests/chart/test_security.py checks every name against the dataclasses.
*/}}
{{- define "sluice.securityEnv" -}}
{{- $p := include "sluice.envPrefix" . }}
{{- $tls := .ctx.Values.tls }}
{{- $a := .ctx.Values.auth }}
{{- if $tls.enabled }}
- name: {{ $p }}TLS_CERT
  value: {{ include "sluice.tlsDir" . }}/tls.crt
- name: {{ $p }}TLS_KEY
  value: {{ include "sluice.tlsDir" . }}/tls.key
- name: {{ $p }}TLS_CA
  value: {{ include "sluice.tlsDir" . }}/ca.crt
- name: {{ $p }}TLS_CLIENT_AUTH
  value: {{ $tls.clientAuth | quote }}
{{- if $tls.metrics }}
- name: {{ $p }}TLS_METRICS
  value: "true"
{{- end }}
{{- end }}
{{- if $a.enabled }}
- name: {{ $p }}AUTH_MECHANISMS
  value: {{ join "," $a.mechanisms | quote }}
- name: {{ $p }}ALLOW_ANONYMOUS
  value: {{ $a.allowAnonymous | quote }}
- name: {{ $p }}AUTHORIZATION
  value: {{ $a.authorization | quote }}
- name: {{ $p }}SUPER_USERS
  value: {{ join "," $a.superUsers | quote }}
- name: {{ $p }}CLUSTER_TOKEN_FILE
  value: {{ include "sluice.clusterTokenDir" . }}/token
{{- if has "jwt" $a.mechanisms }}
- name: {{ $p }}JWT_JWKS_URL
  value: {{ $a.jwt.jwksUrl | quote }}
- name: {{ $p }}JWT_ISSUER
  value: {{ $a.jwt.issuer | quote }}
- name: {{ $p }}JWT_AUDIENCE
  value: {{ $a.jwt.audience | quote }}
- name: {{ $p }}JWT_ALGORITHMS
  value: {{ $a.jwt.algorithms | quote }}
- name: {{ $p }}JWT_PRINCIPAL_CLAIM
  value: {{ $a.jwt.principalClaim | quote }}
- name: {{ $p }}JWT_JWKS_REFETCH_INTERVAL
  value: {{ $a.jwt.jwksRefetchInterval | quote }}
- name: {{ $p }}JWT_JWKS_MAX_AGE
  value: {{ $a.jwt.jwksMaxAge | quote }}
{{- if $a.jwt.kubernetesCA }}
{{- /* The API server's JWKS: verified with the cluster CA, fetched with the pod's own (rotated) token. */}}
- name: {{ $p }}JWT_JWKS_CA_FILE
  value: {{ include "sluice.kubernetesSADir" . }}/ca.crt
- name: {{ $p }}JWT_JWKS_TOKEN_FILE
  value: {{ include "sluice.kubernetesSADir" . }}/token
{{- end }}
{{- if $a.jwt.tokenReview.enabled }}
- name: {{ $p }}JWT_TOKEN_REVIEW
  value: "true"
- name: {{ $p }}JWT_TOKEN_REVIEW_INTERVAL
  value: {{ $a.jwt.tokenReview.interval | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Read-only mounts of the certificate and the cluster token (whole directories: a subPath would never see a rotation). */}}
{{- define "sluice.securityVolumeMounts" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  mountPath: {{ include "sluice.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if .ctx.Values.auth.enabled }}
- name: cluster-token
  mountPath: {{ include "sluice.clusterTokenDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "sluice.securityVolumes" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "sluice.tlsSecretName" . }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- if .ctx.Values.auth.enabled }}
- name: cluster-token
  secret:
    secretName: {{ include "sluice.clusterTokenSecretName" .ctx }}
    defaultMode: 0440
    items:
      - key: token
        path: token
{{- end }}
{{- end }}

{{/* automountServiceAccountToken of a Sluice pod: `need` (the coordinator's election), the Kubernetes JWKS or TokenReview. */}}
{{- define "sluice.automountToken" -}}
{{- if or .need (include "sluice.kubernetesJwks" .ctx) (include "sluice.tokenReview" .ctx) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
The Redis pods' credentials: REDIS_PASSWORD is the default user's (admin) password, which replication, the
Sentinels and redis-cli (REDISCLI_AUTH: the probes, find-primary.sh) use; SLUICE_REDIS_* define the ACL
user the Sluice services log in as.
*/}}
{{- define "sluice.redisAuthEnv" -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: admin-password
- name: REDISCLI_AUTH
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: admin-password
- name: SLUICE_REDIS_USER
  value: {{ .ctx.Values.components.redis.auth.username | quote }}
- name: SLUICE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: redis-password
- name: SLUICE_REDIS_ACL_RULES
  value: {{ .ctx.Values.components.redis.auth.aclRules | quote }}
{{- end }}

{{/*
What a user adds to a Sluice pod (values components.<c>.initContainers, extraContainers, extraVolumes,
extraVolumeMounts): Kubernetes objects as given, appended after the chart's own, so a sidecar or a mounted
CA bundle needs no fork of the chart.
*/}}
{{- define "sluice.initContainers" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- with (dig "initContainers" list $c) }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "sluice.extraContainers" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- with (dig "extraContainers" list $c) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "sluice.extraVolumeMounts" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- with (dig "extraVolumeMounts" list $c) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "sluice.extraVolumes" -}}
{{- $c := index .ctx.Values.components (include "sluice.valuesKey" .) -}}
{{- with (dig "extraVolumes" list $c) }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* The name of broker <index>'s external Service (values components.broker.externalAccess). */}}
{{- define "sluice.brokerExternalName" -}}
{{- printf "%s-%d-external" (include "sluice.componentName" (dict "ctx" .ctx "component" "broker")) .index }}
{{- end }}
