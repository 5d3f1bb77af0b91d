"""A stand-in reward service for the held-out tests (tests/integration/test_controller_validation.py
and test_controller_evals.py): a dataset of three prompts, the correctness it reports for each,
and the driver's routing of the `estimates` stream."""

from __future__ import annotations

import json

from magic.controller.validation import Validation
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.streams import Stream

CORRECT = {"held:1": [1, 0, 0, 0], "held:2": [0, 0, 0, 0], "held:3": [1, 1, 1, 1]}
"""Correct samples per prompt the fake reward service reports (n = 4)."""


def held_file(tmp_path):
    """The held-out dataset: three prompts with ground truths (their uids held:1..3)."""
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"q{i}", "reward_model": {"ground_truth": str(i)}}) + "\n" for i in range(1, 4)))
    return held


def score(r, run: str, forged: str | None = None, stop_after: int | None = None) -> int:
    """Score every published held-out group not scored yet (as the reward service does: to
    `estimates`, n samples with the correctness of CORRECT); returns how many it scored. `forged`:
    also send a redelivered copy of a group already scored and a group of that id the controller
    never published."""
    rk = keys.RunKeys(run)
    done = {g.rollout.prompt.group_id for _, g in Stream(r, rk.estimates).read_after("0", pb.ScoredGroup)}
    n = 0
    for _, prompt in Stream(r, rk.prompts).read_after("0", pb.PromptGroup):
        if prompt.kind != pb.GROUP_KIND_VALIDATE or prompt.group_id in done or (stop_after is not None and n >= stop_after):
            continue
        group = pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=prompt))
        for i, c in enumerate(CORRECT[prompt.prompt_uid][: prompt.sampling.n]):
            answer = prompt.ground_truth if c else ("9" if i in (1, 2) else "")  # the majority answer: right for held:3 only
            group.rollout.samples.add(response_ids=[1] * (3 + i), finish_reason=pb.FINISH_REASON_LENGTH if i == 3 else pb.FINISH_REASON_STOP, policy_version=prompt.policy_version,
                                      text=f"so the answer is \\boxed{{{answer}}}" if answer else "I give up")
            group.scores.add(correctness=float(c), reward=float(c), answer=answer, verdict=pb.VERDICT_CORRECT if c else (pb.VERDICT_WRONG if answer else pb.VERDICT_NO_ANSWER))
        r.xadd(rk.estimates, codec.encode(group))
        n += 1
    if forged:
        _, first = next(iter(Stream(r, rk.estimates).read_after("0", pb.ScoredGroup)))
        r.xadd(rk.estimates, codec.encode(first))
        fake = pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=pb.PromptGroup(run_id=run, group_id=forged, kind=pb.GROUP_KIND_VALIDATE, policy_version=2, prompt_uid="held:1", sampling=pb.SamplingParams(n=4))))
        r.xadd(rk.estimates, codec.encode(fake))
    return n


def run_job(job, tick):
    """Advance a side job (`magic.controller.sidejobs`) as the driver does, `tick` between its steps."""
    while not job.advance():
        tick()
    return job.result()


def receive(v: Validation) -> None:
    """The driver's routing of the `estimates` stream (`SideJobs.route`) to the validation."""
    batch = [(e, g) for e in v.estimates.read(count=100, block_ms=None) if (g := v.estimates.decode(e, pb.ScoredGroup)) is not None]
    if batch:
        v.receive(batch)
