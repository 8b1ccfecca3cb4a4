"""OpenAI's embeddings API, as this server reads and writes it: request parsing (captions, and images as
``data:image/...;base64,`` URIs), the response (float lists or base64 float32 little-endian bytes, input order,
``usage``), clip_flash's per-item ``errors``, and OpenAI's error shape.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import orjson

from .jobs import IMAGE, TEXT, Embedded, ItemError, Result

DATA_IMAGE_PREFIX = "data:image/"
ENCODING_FORMATS = ("float", "base64")
NOT_A_STRING = ("input items must be strings: a caption, or an image as a data URI "
                "(data:image/<type>;base64,<data>)")

Input = Tuple[str, Union[bytes, str]]  # (IMAGE, encoded image bytes) or (TEXT, caption)


class RequestError(Exception):
    """A request this server cannot take: its HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error", headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None, errors: Optional[List[Dict[str, Any]]] = None) -> bytes:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` (plus clip_flash's per-item
    ``errors`` when every item failed)."""
    body: Dict[str, Any] = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    if errors is not None:
        body["errors"] = errors
    return orjson.dumps(body)


class EmbeddingsRequest:
    """A parsed ``POST /v1/embeddings`` body. ``dimensions``: OpenAI's field, None when absent (or null); the
    routes compare it with the model's embedding width (``check_dimensions``)."""

    __slots__ = ("model", "inputs", "encoding_format", "normalize", "dimensions")

    def __init__(self, model: Optional[str], inputs: List[Union[Input, ItemError]], encoding_format: str,
                 normalize: bool, dimensions: Optional[int] = None) -> None:
        self.model = model
        self.inputs = inputs
        self.encoding_format = encoding_format
        self.normalize = normalize
        self.dimensions = dimensions


def check_dimensions(dimensions: Optional[int], width: int, model: str) -> None:
    """OpenAI's ``dimensions`` shortens text-embedding-3's vectors, trained to be cut (Matryoshka); a CLIP
    embedding is not, so only the model's own width is taken: ``RequestError`` (400) for any other."""
    if dimensions is not None and dimensions != width:
        raise RequestError(400, f"the model '{model}' gives embeddings of {width} dimensions and cannot be "
                                f"shortened (CLIP embeddings are not trained for truncation): leave 'dimensions' "
                                f"out or send {width}, not {dimensions}", param="dimensions")


QUERY_TRUE, QUERY_FALSE = ("true", "1"), ("false", "0")


def query_flag(query: Any, name: str, default: bool) -> bool:
    """A true/false query parameter (``true``/``false`` or ``1``/``0``, any case); ``RequestError`` (400) for
    any other value or a parameter given twice."""
    values = query.getlist(name)
    if not values:
        return default
    if len(values) > 1:
        raise RequestError(400, f"query parameter '{name}' is given {len(values)} times; give it once", param=name)
    value = values[0].lower()
    if value in QUERY_TRUE:
        return True
    if value in QUERY_FALSE:
        return False
    raise RequestError(400, f"query parameter '{name}' must be true or false (or 1 or 0), got {values[0]!r}",
                       param=name)


def query_choice(query: Any, name: str, choices: Sequence[str]) -> str:
    """A query parameter that takes one of ``choices`` (the first is the default); ``RequestError`` (400) for any
    other value or a parameter given twice."""
    values = query.getlist(name)
    if not values:
        return choices[0]
    if len(values) > 1:
        raise RequestError(400, f"query parameter '{name}' is given {len(values)} times; give it once", param=name)
    if values[0] not in choices:
        raise RequestError(400, f"query parameter '{name}' must be one of {list(choices)}, got {values[0]!r}",
                           param=name)
    return values[0]


def decode_data_uri(text: str) -> bytes:
    """The bytes of a ``data:image/<type>;base64,<data>`` URI; ``ValueError`` saying what is wrong."""
    comma = text.find(",")
    if comma < 0:
        raise ValueError("image data URI has no ',' before its data")
    header = text[5:comma]
    if ";base64" not in header:
        raise ValueError(f"image data URI must be base64 (data:{header};base64,<data>)")
    try:
        return base64.b64decode(text[comma + 1:], validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"image data URI is not valid base64: {error}") from None


def classify(value: Any) -> Union[Input, ItemError]:
    """One input string: an image (data URI) or a caption; anything else is that item's error."""
    if type(value) is not str:
        return ItemError(NOT_A_STRING)
    if value.startswith(DATA_IMAGE_PREFIX):
        try:
            return (IMAGE, decode_data_uri(value))
        except ValueError as error:
            return ItemError(str(error))
    return (TEXT, value)


def parse_embeddings_request(body: bytes) -> EmbeddingsRequest:
    """Parse and check a request body; ``RequestError`` (400) for what OpenAI's API would refuse too."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RequestError(400, f"the body is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "the body must be a JSON object with 'input' (and 'model')")
    if "input" not in payload:
        raise RequestError(400, "'input' is required: a string or a list of strings", param="input")
    raw = payload["input"]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise RequestError(400, "'input' must be a string or a list of strings", param="input")
    if not raw:
        raise RequestError(400, "'input' is an empty list", param="input")
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "'model' must be a string", param="model")
    encoding_format = payload.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise RequestError(400, f"'encoding_format' must be one of {list(ENCODING_FORMATS)}, got "
                           f"{encoding_format!r}", param="encoding_format")
    normalize = payload.get("normalize", True)
    if not isinstance(normalize, bool):
        raise RequestError(400, "'normalize' must be true or false", param="normalize")
    dimensions = payload.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        shown = orjson.dumps(dimensions).decode()
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise RequestError(400, f"'dimensions' must be a positive integer, got {shown}", param="dimensions")
    return EmbeddingsRequest(model, [classify(value) for value in raw], encoding_format, normalize, dimensions)


def embeddings_response(model: str, results: Sequence[Optional[Result]], encoding_format: str,
                        normalize: bool) -> Tuple[int, bytes]:
    """(status, body): 200 with ``data`` in input order (each entry keeping its input ``index``) and, if any
    item failed, ``errors``; 400 when every item failed."""
    data: List[Dict[str, Any]] = []
    errors: List[Dict[str, Any]] = []
    tokens = 0
    as_base64 = encoding_format == "base64"
    for index, result in enumerate(results):
        if type(result) is Embedded:
            vector = result.normalized if normalize else result.raw
            embedding: Any = base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii") \
                if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens += result.tokens
        else:
            message = result.message if result is not None else "no embedding was produced"
            errors.append({"index": index, "message": message})
    if not data:
        what = "the input" if len(results) == 1 else f"all {len(results)} inputs"
        detail = f": {errors[0]['message']}" if len(errors) == 1 else " (see 'errors')"
        return 400, error_body(f"no embedding for {what}{detail}", errors=errors)
    body: Dict[str, Any] = {"object": "list", "model": model, "data": data,
                            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if errors:
        body["errors"] = errors
    return 200, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
