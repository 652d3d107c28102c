"""The instrument: the probes that watch one training step, the step they watch, and what they record. It imports
only `compat` and `transforms.naming`, and leaves nothing in the process when it returns."""
