"""MAGIC: the Skywork-OR1 recipe (multi-stage GRPO with adaptive entropy control) as services.

Sources live in `services/` and import as `magic`:

    magic.common      config, Redis bus, protobuf codecs, metrics, logging, weight store
    magic.controller  REST API and the on-policy step barrier
    magic.rollout     rollout engines and the rollout worker
    magic.reward      verifiers and the reward worker
    magic.learner     the algorithm (core_algos), the trainer and the learner worker
    magic.demo        the tiny local model and task (tokenizer, data, supervised warm start)
    magic.local       the one-machine launcher (`magic local`)
"""
