"""The quick causality probe of the check before a run: a model that looks at future tokens would
score an impossibly low loss, and is refused before it trains.

For a few positions t, the tokens after t are replaced with random ones; the logits at
positions 0..t must not change. Each variant runs alone at batch 1 (so every row goes through
the same kernels as in the reference) and in float32 (no autocast rounding): for a causal
model the prefix logits are then equal to within float noise. Run on random tokens with the
freshly built model by the check process. A model that looks ahead only once trained, only in
larger batches or only under autocast passes it: evaluation checks causality again on the
scoring batches themselves (harness/scoring/plan.py).
"""

from __future__ import annotations

TOLERANCE = 1e-4  # relative to the largest reference logit (float32)


def probe_causality(model, window, vocab_size: int, device, seed: int = 0) -> dict:
    """{causal, max_rel_diff, worst_position, positions} for a [T] window of token ids."""
    import torch

    T = int(window.numel())
    positions = sorted({t for t in (0, T // 4, T // 2, T - 2) if 0 <= t < T - 1})
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    worst, worst_t = 0.0, None
    try:
        with torch.inference_mode():
            ref = model(window.view(1, T).to(device))[0].float()[0]
            for t in positions:
                changed = window.clone()
                changed[t + 1:] = torch.randint(0, vocab_size, (T - t - 1,), generator=gen)
                out = model(changed.view(1, T).to(device))[0].float()[0]
                scale = float(ref[: t + 1].abs().max()) + 1e-6
                rel = float((out[: t + 1] - ref[: t + 1]).abs().max()) / scale
                if rel > worst:
                    worst, worst_t = rel, t
    finally:
        model.train(was_training)
    return {"causal": worst <= TOLERANCE, "max_rel_diff": worst, "worst_position": worst_t, "positions": positions}


def describe(result: dict) -> str:
    t = result["worst_position"]
    return (f"non-causal: the logits at positions <= {t} changed (by {result['max_rel_diff']:.2g} of their scale) "
            f"when only the tokens after position {t} were changed; a model may only use earlier tokens")
