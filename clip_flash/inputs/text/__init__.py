"""Text in: strings to OpenCLIP's token ids (:mod:`.tokenizer`)."""
