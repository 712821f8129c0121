"""The evaluator: harness-only processes that hold the validation tokens and compute the score.

A scorer is a torch elastic rank of the evaluation job. It never imports the submission: the
model runs in two sandboxed child processes per scorer (harness/ranks/models/model_worker.py), which get
the inputs of one batch at a time and hand back logits; the targets never leave the scorer. One
child scores; the other re-runs a secret sample of the scored batches with every row's tokens
after a secret cut replaced, so causality is checked on the scoring itself.
"""
