"""Loading OpenCLIP models from a spec: ``NAME`` (random-init weights, labelled so), ``NAME::TAG`` (OpenCLIP's
pretrained tag, from the local cache or the hub, failing in seconds when the hub cannot be reached) or
``NAME::/path/to/checkpoint``. The job, the server and the benchmarks all load models through here."""
from .model_spec import (
    DEFAULT_MODEL_SET, PRECISION_DTYPES, RANDOM_INIT_NOTE, ExpectedInputs, LoadedModel, ModelLoadError, ModelSpec,
    fp32_reference, image_size_of, import_model_library, inputs_before_load, load_model, parse_model_spec,
    precision_warning,
)
from .weights_fetch import WeightsUnreachableError

__all__ = [
    "DEFAULT_MODEL_SET", "ExpectedInputs", "LoadedModel", "ModelLoadError", "ModelSpec", "PRECISION_DTYPES",
    "RANDOM_INIT_NOTE", "WeightsUnreachableError", "fp32_reference", "image_size_of", "import_model_library",
    "inputs_before_load", "load_model", "parse_model_spec", "precision_warning",
]
