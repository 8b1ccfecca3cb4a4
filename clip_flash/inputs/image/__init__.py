"""Images in: files, bytes, PIL images or arrays to OpenCLIP's model-ready batch (:mod:`.preprocessor`)."""
