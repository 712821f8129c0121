"""The fixed loop's training ranks: the rank process, the step loop, its clock, the ranks' vote, the weights after.

- train.py: one training rank, started by torch elastic (`python -m harness.ranks.training.train`);
- loop.py: the fixed DDP loop, the harness's from the first batch to the last step;
- clock.py: the stop rule and the lr schedule's clock; agree.py: the ranks' vote once a step;
- first_step.py: does the model arrive trained?; ddp.py: DDP as the track sets it; probe.py: the
  communication probe; after_clock.py: the weights copied and checked, the checkpoint written.

What they share with the other processes that run team code (the checkpoint, the FLOP counter, the
channel, how a rank starts and leaves) is one floor up, in harness/ranks/. Nothing here is loaded by
the check or evaluation's model processes (harness/ranks/models/), nor by the open division's rank.
"""
