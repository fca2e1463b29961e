"""Tensor helpers shared by the Python models: read optional inputs as numpy, required inputs
(an error naming the missing one), scalars with defaults, UTF-8 strings with a clear error, build
output tensors, and answer each request of an ``execute`` call on its own. Runs inside the stub."""

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


def required(request, name: str, client_name: str | None = None) -> np.ndarray:
    """An input the model cannot do without. Triton's own check only counts a request's inputs,
    and an ensemble whose required input is missing never schedules the step that needs it (an
    empty, successful response), so the model names the missing input itself."""
    value = get(request, name)
    if value is None:
        via = f" (the ensemble's {client_name!r})" if client_name else ""
        raise RequestError(f"missing required input {name!r}{via}")
    return value


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


def invalid_request_response(message: str) -> "pb_utils.InferenceResponse":
    """An error response for a bad request: INVALID_ARG (gRPC INVALID_ARGUMENT, HTTP 400), as
    Triton answers its own input checks, where the stub knows the code."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def answer_each(requests, process, model: str) -> list:
    """One response per request from ``process(request) -> [tensors]``: a bad request gets its own
    error response (RequestError text), an unexpected failure an error naming the model; the other
    requests of the same ``execute`` call are answered normally."""
    responses = []
    for request in requests:
        try:
            responses.append(pb_utils.InferenceResponse(output_tensors=process(request)))
        except RequestError as exc:
            responses.append(invalid_request_response(str(exc)))
        except Exception as exc:  # noqa: BLE001 - one request's failure must not fail its batch
            responses.append(error_response(f"{model} failed: {type(exc).__name__}: {exc}"))
    return responses


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
