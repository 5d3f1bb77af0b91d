{{/* The alert rules (Prometheus rule groups), for this release's series only: each selector is
limited to namespace=<release namespace>, release=<release name> (labels the ServiceMonitor sets),
so that two releases each alert on their own run. Thresholds come from metrics.alerts. */}}
{{- define "magic.alertRules" -}}
{{- $a := .Values.metrics.alerts }}
{{- $sel := printf "namespace=%q, release=%q" .Release.Namespace .Release.Name }}
{{- $by := "namespace, release" }}
{{- /* the learner's startup budget: torchrun waits at the rendezvous for every learner pod, DeepSpeed starts */}}
{{- $learnerStart := printf "%ds" (mul (int .Values.learner.startupProbe.periodSeconds) (int .Values.learner.startupProbe.failureThreshold)) }}
{{- /* the replicas the chart deploys: what "live workers below expected" compares with */}}
{{- $expected := dict "rollout" (int .Values.rollout.replicas) "reward" (int .Values.reward.replicas) }}
{{- /* a learner job of any shape is one live learner worker: its rank 0 */}}
{{- $_ := set $expected "learner" (min 1 (int .Values.learner.nodes)) }}
groups:
  - name: magic-training
    rules:
      - alert: MagicEntropyCollapse
        expr: magic_policy_entropy{component="learner", {{ $sel }}} < {{ $a.entropyCollapse.ratio }} * magic_entropy_target{component="learner", {{ $sel }}}
        for: {{ $a.entropyCollapse.for }}
        labels:
          severity: warning
        annotations:
          summary: Policy entropy collapsed below {{ $a.entropyCollapse.ratio }} x its target
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: the policy's entropy over the rollout batch is
            {{ "{{" }} $value | printf "%.3g" {{ "}}" }} nats, under {{ $a.entropyCollapse.ratio }} x the stage's
            target tgt_ent, for {{ $a.entropyCollapse.for }}. Adaptive entropy control is not holding it:
            check magic_entropy_coef (stuck at its bound?) and the learning rate.
      - alert: MagicClipRatioRunaway
        expr: magic_response_clip_ratio{component="learner", {{ $sel }}} > {{ $a.clipRatioRunaway.threshold }}
        for: {{ $a.clipRatioRunaway.for }}
        labels:
          severity: warning
        annotations:
          summary: Over {{ $a.clipRatioRunaway.threshold }} of the responses are truncated at T
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the
            responses hit the context length T for {{ $a.clipRatioRunaway.for }}. Move to the next stage
            (longer T) or check for repetition.
  - name: magic-operations
    rules:
      - alert: MagicNoStep
        expr: >-
          (max by ({{ $by }}) (changes(magic_step{component="controller", {{ $sel }}}[{{ $a.noStep.for }}])) == 0)
          and on ({{ $by }})
          (max by ({{ $by }}) (magic_step{component="controller", {{ $sel }}} offset {{ $a.noStep.for }}))
          and on ({{ $by }})
          (sum by ({{ $by }}) (magic_stream_lag{component="controller", stream=~"prompts|rollouts|scored", {{ $sel }}}
            + magic_stream_pending{component="controller", stream=~"prompts|rollouts|scored", {{ $sel }}}) > 0)
        labels:
          severity: critical
        annotations:
          summary: No training step for {{ $a.noStep.for }} while work is waiting
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: the step counter has not moved for {{ $a.noStep.for }}
            though {{ "{{" }} $value {{ "}}" }} stream entries are waiting. Check that the rollout, reward and
            learner workers are alive (magic_live_workers) and their logs.
      - alert: MagicDeadLetters
        {{- /* every consumer's series exists at 0 from its attach (magic.store.streams.ConsumerGroup), so
        increase() sees the first letter too */}}
        expr: sum by ({{ $by }}, stream) (increase(magic_dead_letters_total{ {{- $sel -}} }[{{ $a.deadLetters.window }}])) > 0
        labels:
          severity: warning
        annotations:
          summary: Stream entries were moved to the dead-letter stream
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | printf "%.0f" {{ "}}" }} entries of stream
            {{ "{{" }} $labels.stream {{ "}}" }} were dead-lettered in the last {{ $a.deadLetters.window }} (poison
            messages): read them with XRANGE magic:{<run>}:dead.
      - alert: MagicRewardTimeouts
        expr: >-
          sum by ({{ $by }}, kind) (rate(magic_reward_timeouts_total{component="reward", {{ $sel }}}[{{ $a.rewardTimeouts.window }}]))
          / sum by ({{ $by }}, kind) (rate(magic_reward_verdicts_total{component="reward", {{ $sel }}}[{{ $a.rewardTimeouts.window }}]))
          > {{ $a.rewardTimeouts.ratio }}
        for: {{ $a.rewardTimeouts.for }}
        labels:
          severity: warning
        annotations:
          summary: Over {{ $a.rewardTimeouts.ratio }} of the {{ "{{" }} $labels.kind {{ "}}" }} responses time out in the verifier
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the
            {{ "{{" }} $labels.kind {{ "}}" }} responses hit a verifier or sandbox time limit. Add reward pods or CPU,
            or raise the time limits.
      - alert: MagicRewardErrors
        expr: >-
          sum by ({{ $by }}, kind) (rate(magic_reward_verdicts_total{component="reward", verdict="error", {{ $sel }}}[{{ $a.rewardErrors.window }}]))
          / sum by ({{ $by }}, kind) (rate(magic_reward_verdicts_total{component="reward", {{ $sel }}}[{{ $a.rewardErrors.window }}]))
          > {{ $a.rewardErrors.ratio }}
        for: {{ $a.rewardErrors.for }}
        labels:
          severity: warning
        annotations:
          summary: Over {{ $a.rewardErrors.ratio }} of the {{ "{{" }} $labels.kind {{ "}}" }} responses cannot be judged
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | humanizePercentage {{ "}}" }} of the
            {{ "{{" }} $labels.kind {{ "}}" }} responses get verdict `error` (reward 0 whatever the answer): the
            verifier or the code judge failed. The reward pods' logs say why (for code: the code judge's
            log, its sandbox's self-check at start).
      - alert: MagicTargetDown
        {{- /* vLLM is scraped through its rollout worker: magic_vllm_up says whether the worker could read it.
        A learner pod serves /metrics only once torchrun's rendezvous and DeepSpeed have started (up to the
        startup budget on a multi-node start): its target counts here once it has answered within that
        budget; one that stays down through the whole budget is MagicLearnerDown. */}}
        expr: >-
          (up{component=~"controller|rollout|reward|codejudge|redis", {{ $sel }}} == 0)
          or (up{component="learner", {{ $sel }}} == 0 and max_over_time(up{component="learner", {{ $sel }}}[{{ $learnerStart }}]) == 1)
          or label_replace(magic_vllm_up{component="rollout", {{ $sel }}} == 0, "component", "vllm", "", "")
        for: {{ $a.targetDown.for }}
        labels:
          severity: critical
        annotations:
          summary: The {{ "{{" }} $labels.component {{ "}}" }} target {{ "{{" }} $labels.instance {{ "}}" }} cannot be scraped
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: Prometheus (or, for vllm, the rollout worker beside it)
            could not read the {{ "{{" }} $labels.component {{ "}}" }} metrics of {{ "{{" }} $labels.instance {{ "}}" }}
            for {{ $a.targetDown.for }}: the pod is down, restarting, or not admitted by the NetworkPolicy
            (networkPolicy.metricsIngressFrom).
      - alert: MagicLearnerDown
        expr: up{component="learner", {{ $sel }}} == 0
        for: {{ $learnerStart }}
        labels:
          severity: critical
        annotations:
          summary: The learner target {{ "{{" }} $labels.instance {{ "}}" }} has not answered for the learner's whole startup budget
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: Prometheus could not read the learner metrics of
            {{ "{{" }} $labels.instance {{ "}}" }} for {{ $learnerStart }} (learner.startupProbe: periodSeconds x
            failureThreshold): a learner pod that never started (a node that never joined torchrun's rendezvous,
            an image that cannot be pulled, a model that does not fit: the pod's log says which) or one that
            has been down that long.
      - alert: MagicLiveWorkersBelowExpected
        {{- $terms := list }}
        {{- range $service := list "rollout" "reward" "learner" }}
        {{- if gt (get $expected $service) 0 }}
        {{- $terms = append $terms (printf "(magic_live_workers{component=\"controller\", service=\"%s\", %s} < %d)" $service $sel (get $expected $service)) }}
        {{- end }}
        {{- end }}
        expr: >-
          {{ join "\n          or " $terms | default "vector(0) > 1" }}
        for: {{ $a.liveWorkers.for }}
        labels:
          severity: warning
        annotations:
          summary: Fewer live {{ "{{" }} $labels.service {{ "}}" }} workers than deployed
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value {{ "}}" }} {{ "{{" }} $labels.service {{ "}}" }}
            workers have a fresh heartbeat on the run, fewer than the chart deploys (rollout {{ get $expected "rollout" }},
            reward {{ get $expected "reward" }}, learner {{ get $expected "learner" }}), for {{ $a.liveWorkers.for }}.
            Pods pending (no GPU free?), crash-looping, or unable to reach Redis.
      - alert: MagicRedisMemoryHigh
        expr: >-
          redis_memory_used_bytes{component="redis", {{ $sel }}}
          / (redis_memory_max_bytes{component="redis", {{ $sel }}} > 0)
          > {{ $a.redisMemory.ratio }}
        for: {{ $a.redisMemory.for }}
        labels:
          severity: warning
        annotations:
          summary: Redis uses over {{ $a.redisMemory.ratio }} of its maxmemory
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: Redis uses {{ "{{" }} $value | humanizePercentage {{ "}}" }}
            of its maxmemory; at the limit it refuses writes (noeviction) and the run stalls. Raise
            redis.maxmemory (and its memory limit), or lower D_R x gs (docs/scale.md).
      - alert: MagicRedisRefusedWrites
        {{- /* counted by the services that were refused (magic.store.client; any Redis, the bundled one or
        yours): an unlabelled counter, at 0 from each process's start */}}
        expr: sum by ({{ $by }}) (increase(magic_redis_refused_writes_total{ {{- $sel -}} }[{{ $a.redisRefusedWrites.window }}])) > 0
        labels:
          severity: critical
        annotations:
          summary: Redis refused writes at maxmemory
          description: >-
            Release {{ "{{" }} $labels.release {{ "}}" }}: {{ "{{" }} $value | printf "%.0f" {{ "}}" }} writes were refused
            (OOM at maxmemory, noeviction: the services count them) in the last {{ $a.redisRefusedWrites.window }}; the services retry them,
            and the run stalls until memory is freed. Raise redis.maxmemory or lower D_R x gs.
{{- end }}

{{/* PrometheusRule on, off or auto-detected */}}
{{- define "magic.prometheusRuleEnabled" -}}
{{- $on := toString .Values.metrics.alerts.enabled }}
{{- if or (eq $on "true") (and (eq $on "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule")) }}true{{ end }}
{{- end }}
