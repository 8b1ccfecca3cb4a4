"""What to patch: the plan over an OpenCLIP model (``patching``), its report, and one module per replaced part.

``clip_flash.patch`` the attribute is the ``patch`` function (the package binds it over this subpackage's
name), so import these modules with ``from clip_flash.patch.<module> import ...``.
"""
