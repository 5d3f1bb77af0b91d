"""MAGIC: the Skywork-OR1 recipe (multi-stage GRPO with adaptive entropy control) as services.

The import path is the file path: `magic.store.steps` is `services/magic/store/steps.py`.

Services (one process each; they never import each other):

    magic.controller  REST API and the on-policy step barrier (`driver.py`)
    magic.rollout     rollout engines (torch, vLLM) and the rollout worker
    magic.reward      math verifier, code sandbox, penalties and the reward worker
    magic.learner     the algorithm (`core_algos.py`), the training step (`trainer.py`) and the learner worker

Shared layers:

    magic.protocol       wire messages (protobuf), their codec, Redis key names, run status values
    magic.store          the storage layer: every Redis command (streams, the step contract, run state)
    magic.config         the run schema (RunSpec, StageConfig; the paper's symbols), process settings, CLI flags
    magic.observability  metric names and the /metrics endpoint, logging
    magic.runtime        the serve loop every worker shares, child processes, fault injection, exit codes
    magic.weights        weight transports (filesystem, http, nccl)
    magic.modeling       model loading, per-token log-probs and entropy at temperature tau
    magic.prompts        the tokenizer and the one chat-prompt renderer

Around them: `magic.cli` (the `magic` command, a leaf nothing imports), `magic.local` (`magic
local`, the whole loop on one machine) and `magic.demo` (the tiny model and task).
"""
