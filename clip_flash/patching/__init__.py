"""What to patch: the plan over an OpenCLIP model (``patching``), its report, and one module per replaced part."""
