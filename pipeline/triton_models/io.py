"""Tensor helpers shared by the Python models: read optional inputs as numpy, scalars with
defaults, UTF-8 strings with a clear error, and build output tensors. Runs inside the stub."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils


class RequestError(ValueError):
    """A bad request: answered with this text as a Triton error; the model keeps serving."""


def get(request, name: str) -> np.ndarray | None:
    """An input of a Triton request, or of a dict snapshot taken with :func:`snapshot`."""
    if isinstance(request, dict):
        return request.get(name)
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def scalar(request, name: str, default=None):
    value = get(request, name)
    if value is None or value.size == 0:
        return default
    return value.reshape(-1)[0].item()


def snapshot(request) -> dict[str, np.ndarray]:
    """Copy every input out of the request while ``execute`` still owns it, so worker threads
    never touch the request after ``execute`` has returned."""
    return {t.name(): np.array(t.as_numpy(), copy=True) for t in request.inputs()}


def flag(request, name: str, default: bool = False) -> bool:
    return bool(scalar(request, name, default))


def text(value, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8 text") from None
    return str(value)


def texts(request, name: str) -> list[list[str]] | None:
    """A STRING input as one list of strings per batch row."""
    value = get(request, name)
    if value is None:
        return None
    rows = value.reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    return [[text(v, name) for v in row] for row in rows]


def tensor(name: str, array) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.ascontiguousarray(array))


def error_response(message: str) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def param(model_config: dict, key: str, default: str = "") -> str:
    """A string parameter; values that are empty or an unfilled ``${...}`` mean unset."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    if not value or value.startswith("${"):
        return default
    return value


def param_bool(model_config: dict, key: str, default: bool) -> bool:
    value = param(model_config, key, "")
    if not value:
        return default
    return value.strip().lower() in ("true", "1", "yes")
