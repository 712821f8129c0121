"""Weak scaling: `harness scale` measures step times at several world sizes and predicts the event's from the links."""
