"""Adaptive entropy control (paper §3.2.5): the coefficient c_k and the gate of the entropy bonus.

The one stateful piece of the algorithm: c_k carries over from step to step (and in
checkpoints), so it lives apart from the pure functions of `core_algos`.
"""

from __future__ import annotations

from dataclasses import dataclass

from magic.config.schema import EntropyControl


@dataclass
class EntropyController:
    """Adaptive entropy control (paper §3.2.5):

        alpha_k = c_k * 1{e_k <= tgt_ent},  c_{k+1} = c_k + Delta if e_k < tgt_ent,
                                                     c_k - Delta if e_k > tgt_ent,  c_0 = 0,

    c kept within [coef_min, coef_max]; at e_k = tgt_ent the bonus is on and c stays. With
    `adaptive=False` alpha_k = `coef` at every step. The state is `coef` (c_k) and `step`.
    """

    coef: float = 0.0
    step: int = 0

    @staticmethod
    def alpha(c: float, entropy: float, target: float, adaptive: bool, const: float) -> tuple[float, bool]:
        """alpha_k and the gate 1{e_k <= tgt_ent} for entropy e_k (the gate is always on when not adaptive)."""
        if not adaptive:
            return const, True
        gate = entropy <= target
        return (c if gate else 0.0), gate

    # -- one step's decisions, for a stage's EntropyControl settings `ent` ----------------------

    def current(self, ent: EntropyControl) -> float:
        """The coefficient this step trains with before the gate: c_k, or the constant."""
        return self.coef if ent.adaptive else ent.coef

    def gate_needs_entropy_first(self, ent: EntropyControl) -> bool:
        """alpha_k depends on e_k only when adaptive with c_k > 0: e_k must then be measured at
        theta_k before the first update (with c_k = 0, alpha_k = 0 whatever the gate)."""
        return ent.adaptive and self.coef > 0

    def alpha_for(self, ent: EntropyControl, entropy: float | None) -> tuple[float, bool | None]:
        """alpha_k and the gate for this step; `entropy` is e_k if it was measured first, else None
        (the gate is then decided by `finish_step` from the update pass's entropy)."""
        if entropy is not None:
            return self.alpha(self.coef, entropy, ent.target, ent.adaptive, ent.coef)
        if ent.adaptive:
            return 0.0, None
        return ent.coef, True

    def finish_step(self, ent: EntropyControl, entropy: float, gate: bool | None) -> bool:
        """c_{k+1} from e_k (adaptive only); returns the step's gate 1{e_k <= tgt_ent}."""
        if gate is None:
            gate = entropy <= ent.target if ent.adaptive else True
        if ent.adaptive:
            self.update(entropy, ent.target, ent.delta, ent.coef_min, ent.coef_max)
        return bool(gate)

    def update(self, entropy: float, target: float, delta: float, lo: float, hi: float) -> float:
        """c_{k+1} from e_k; returns the new coefficient."""
        if entropy < target:
            self.coef += delta
        elif entropy > target:
            self.coef -= delta
        self.coef = min(max(self.coef, lo), hi)
        self.step += 1
        return self.coef

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.coef = float(state["coef"])
        self.step = int(state["step"])
