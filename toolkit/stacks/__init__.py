"""Training stacks nobody here wrote, driven by their own code: `torchtitan` (0.3.0, optional extra)."""
