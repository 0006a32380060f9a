"""OpenAI's error object, raised as `APIError` anywhere in a handler and rendered by one handler."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec.server.schemas import JSON_TOO_DEEP, ErrorResponse

logger = logging.getLogger(__name__)
REQUEST_ID_KEY = "localspec.request_id"  # where server/request_ids.py leaves a request's id in its ASGI scope

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",  # a refused Host or Origin, a verdict token that does not match
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",  # a request that did not all arrive in time
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}


class ClientGone(Exception):
    """The client of a non-streamed request went away, which cancelled its request (answered 499)."""


def error_json(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(error_json(exc.status, exc.message, exc.code, exc.param), exc.status, headers=exc.headers)


ERROR_STATUSES = {
    400: "Invalid request (validation, n != 1, prompt longer than the context)",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body too large",
    429: "Queue full; retry after the Retry-After header",
    503: "Models still loading, or the request was cancelled before it finished (retry)",
}
# Documented on every route so that schema-driven clients and fuzzers know the error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": desc} for code, desc in ERROR_STATUSES.items()
}


class OllamaError(BaseModel):
    """Ollama's error body: the message alone."""

    error: str


# The same statuses on Ollama's routes (/api/...), in Ollama's shape.
OLLAMA_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": OllamaError, "description": desc} for code, desc in ERROR_STATUSES.items()
}


OLLAMA_PREFIX = "/api/"  # Ollama's routes: their errors are Ollama's {"error": "message"}
LLAMACPP_PATHS = frozenset({"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/apply-template",
                            "/props"})
"""llama-server's own routes: their errors are its {"error": {"code", "message", "type"}}."""
LLAMACPP_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                        404: "not_found_error", 500: "server_error", 501: "not_supported_error",
                        503: "unavailable_error"}


class LlamaCppErrorBody(BaseModel):
    code: int = Field(description="the HTTP status")
    message: str
    type: str


class LlamaCppError(BaseModel):
    """llama-server's error body (llama.vscode shows `error.message`)."""

    error: LlamaCppErrorBody


# The same statuses on llama-server's routes, in its shape.
LLAMACPP_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": LlamaCppError, "description": desc} for code, desc in ERROR_STATUSES.items()
}


def llamacpp_error(status: int, message: str) -> dict[str, Any]:
    kind = LLAMACPP_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}


ANTHROPIC_PREFIX = "/v1/messages"  # Anthropic's Messages API: its errors are {"type": "error", "error": {...}}
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                         429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class AnthropicErrorBody(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body (its SDK raises by status and shows `error.message`)."""

    type: str = "error"
    error: AnthropicErrorBody


# The same statuses on the Messages API's routes, in its shape.
ANTHROPIC_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": AnthropicError, "description": desc} for code, desc in ERROR_STATUSES.items()
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(path: str, status: int, message: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """An error in the shape of the API `path` belongs to: Ollama's on /api/, llama-server's on its own
    routes, Anthropic's on /v1/messages, OpenAI's elsewhere."""
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    if path in LLAMACPP_PATHS:
        return llamacpp_error(status, message)
    if path.startswith(ANTHROPIC_PREFIX):
        return anthropic_error(status, message)
    return error_json(status, message, code, param)


def render(request: Request, status: int, message: str, code: str | None = None, param: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error in the shape the route's API has (error_body)."""
    return JSONResponse(error_body(request.url.path, status, message, code, param), status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return render(request, exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(ClientGone)
    async def _client_gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it, logs do

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default is 422 {"detail": [...]}; OpenAI clients expect 400 and an error object.
        errs = exc.errors()
        first: Any = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        if (not_json := _not_json(request, first)) is not None:
            return render(request, 400, not_json, "invalid_json")
        param, why = field_error(errs)
        msg = f"{param}: {why}" if param else why
        code = JSON_TOO_DEEP if first.get("type") == JSON_TOO_DEEP else "invalid_value"
        return render(request, 400, msg, code, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _UNPARSED:  # FastAPI's words for bad UTF-8 or deep nesting
            return render(request, 400, f"The body could not be read as JSON. {_JSON_FIX}", "invalid_json")
        code = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
                413: "body_too_large"}.get(exc.status_code)
        return render(request, exc.status_code, _routing(request, exc), code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        rid = request.scope.get(REQUEST_ID_KEY, "?")
        logger.error("request %s (%s %s) failed: %s: %s", rid, request.method, request.url.path,
                     type(exc).__name__, exc)
        return render(request, 500, f"internal error: {type(exc).__name__}: {exc} (request {rid})")


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _branch(part: Any) -> bool:
    """A union branch's tag in pydantic's loc ("str", "literal['json','']", "list[TextPart]"): not a field the
    client sent, so an error that named it ("format.literal['json','']: ...") named a field that is not there."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)


def field_error(errs: Sequence[Any]) -> tuple[str | None, str]:
    """The first error's field, as the client spelled it, and why. Where each branch of a union refused the
    value at that field, each branch's words are joined: "Input should be a valid string, or a valid list",
    not the first branch's alone, which said a string was wanted where a list was as good."""
    def named(err: Any) -> list[Any]:
        loc = list(err.get("loc", ()))
        where = loc[1:] if loc[:1] in (["body"], ["query"], ["path"]) else loc  # FastAPI's part, not the client's name
        return [p for p in where if not _branch(p)]

    first: Any = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    loc = named(first)
    if any(_branch(p) for p in first.get("loc", ())):  # a branch the value's own type took says more ("stop.0")
        first = next((e for e in errs if len(named(e)) > len(loc) and named(e)[:len(loc)] == loc
                      and any(_branch(p) for p in e.get("loc", ()))), first)
        loc = named(first)
    whys: list[str] = []
    for err in errs:
        if named(err) == loc:
            why = str(err["msg"]).removeprefix("Value error, ")  # pydantic's words for a validator's ValueError
            if why not in whys:
                whys.append(why)
    rest = [w.removeprefix("Input should be ") for w in whys[1:] if w.startswith("Input should be ")]
    why = ", or ".join([whys[0], *rest]) if whys and whys[0].startswith("Input should be ") else str(first["msg"])
    return ".".join(str(p) for p in loc) or None, why.removeprefix("Value error, ")


def _routing(request: Request, exc: StarletteHTTPException) -> str:
    """Starlette's bare "Not Found" and "Method Not Allowed" (a path this server has not, POST /v1/messages/batches,
    or GET /v1/chat/completions) as the cause and the fix; any other detail as it is."""
    path = "".join(ch if ch.isprintable() else "?" for ch in request.url.path[:100])  # one line, whatever it held
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"{request.method} {path} is not a route of this server: GET /openapi.json lists the routes it serves."
    allow = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
    if exc.status_code == 405 and exc.detail == "Method Not Allowed" and allow:
        return f"{path} takes {allow}, not {request.method}; send a {allow} request."
    return str(exc.detail)


_UNPARSED = "There was an error parsing the body"
_NOT_AN_OBJECT = ("model_attributes_type", "dict_type", "model_type", "missing")  # pydantic's words for the body
_JSON_FIX = "Send UTF-8 JSON with Content-Type: application/json (curl: -H 'Content-Type: application/json')."


def _not_json(request: Request, first: dict[str, Any]) -> str | None:
    """The message for a body that is not a JSON object, or None for a JSON body that fails validation.
    Before: "13: JSON decode error" with param "13", and for curl's -d without a JSON content type
    (form-encoded) "Input should be a valid dictionary", naming neither the cause nor the fix."""
    if first.get("type") == "json_invalid":
        at = next((p for p in first.get("loc", ()) if isinstance(p, int)), None)
        why = first.get("ctx", {}).get("error") or first.get("msg")
        return f"The body is not valid JSON ({why}{f' at character {at}' if at is not None else ''}). {_JSON_FIX}"
    if first.get("loc") != ("body",) or first.get("type") not in _NOT_AN_OBJECT:
        return None  # a field's error, or one of the body's own checks (a lone surrogate)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        sent = f"Content-Type {kind}" if kind else "no Content-Type"
        return f"The body must be a JSON object sent as application/json; this request sent {sent}. {_JSON_FIX}"
    return "The body must be a JSON object ({...}) holding the request's fields."
