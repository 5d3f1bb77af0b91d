"""The run's curves in one PNG: accuracy, entropy, response length and truncation, per step."""

from __future__ import annotations

from pathlib import Path


def plot_run(records: list[dict], out: Path, eval_before: dict | None = None, eval_after: dict | None = None, validation: dict[int, dict] | None = None) -> Path:
    """`validation`: policy version -> in-run held-out figures (`magic.evaluation.Figures` as a
    dict); version k is plotted at step k (the weights step k samples with; the final policy at
    step N, after the last), its 95% CI shaded. `eval_before`/`eval_after`: the larger held-out
    evaluation of the initial and the final policy (Figures as dicts), at steps 0 and N. Each
    held-out label says its prompts and samples: the two evaluations differ in size. Legends sit
    beside the axes, never over a curve's end."""
    try:
        import matplotlib
    except ImportError as exc:  # not in the service images: an extra of the package
        raise ImportError("the run's plot needs matplotlib: pip install 'magic-rl[local]'") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    end = len(records)  # the final policy's version: the weights after the last step
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    ax = axes[0]
    ax.plot(steps, [r["accuracy_all"] for r in records], label="rollout accuracy (all)")
    ax.plot(steps, [r["accuracy_nontruncated"] for r in records], label="rollout accuracy (non-truncated)", alpha=0.6)
    if validation:
        vs = sorted(validation)
        f = validation[vs[0]]
        ax.plot(vs, [validation[v]["avg_at_n"] for v in vs], color="k", marker=".", label=f"held-out avg@{f['samples']}, {f['prompts']} prompts (in-run, 95% CI)")
        ax.fill_between(vs, [validation[v]["avg_at_n_ci_low"] for v in vs], [validation[v]["avg_at_n_ci_high"] for v in vs], color="k", alpha=0.1)
    for figures, x, style, when in ((eval_before, 0, dict(color="tab:gray", marker="s", s=50), "before"), (eval_after, end, dict(color="r", marker="*", s=120), "after")):
        if figures is not None and steps:
            ax.scatter([x], [figures["avg_at_n"]], zorder=3, **style,
                       label=f"held-out {when}: {figures['avg_at_n']:.1%} (avg@{figures['samples']}, {figures['prompts']} prompts)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[1].plot(steps, [r.get("entropy", float("nan")) for r in records], color="tab:purple")
    axes[1].set_ylabel("policy entropy (nats/token)")
    ax = axes[2]
    ax.plot(steps, [r["response_length_mean"] for r in records], color="tab:green", label="mean response length")
    ax.plot(steps, [r["context_length"] for r in records], color="gray", linestyle="--", label="context length T")
    ax.set_ylabel("tokens")
    ax.set_xlabel("on-policy step")
    twin = ax.twinx()
    twin.plot(steps, [r["response_clip_ratio"] for r in records], color="tab:red", alpha=0.5, label="truncated ratio")
    twin.set_ylabel("truncated ratio", color="tab:red")
    twin.set_ylim(0, 1)
    lines, labels = ax.get_legend_handles_labels()
    twin_lines, twin_labels = twin.get_legend_handles_labels()
    ax.legend(lines + twin_lines, labels + twin_labels, loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8)
    for a in axes:
        for prev, cur in zip(records, records[1:]):
            if cur["stage"] != prev["stage"]:
                a.axvline(cur["step"] - 0.5, color="k", alpha=0.3, linestyle=":")
        a.grid(alpha=0.3)
    fig.suptitle("MAGIC local run")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the legends beside the axes included
    plt.close(fig)
    return out
