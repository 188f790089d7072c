"""The voices API: the model's own voices and the cloned ones (``voices.py``), OpenAI-style JSON.

    GET    /v1/audio/voices            the model's voices (the default first), then the cloned ones
    POST   /v1/audio/voices            multipart: name, audio (the reference clip), transcript (optional)
                                       -> 201 the new voice | 200 the voice of this reference, made before
    GET    /v1/audio/voices/{voice}    one voice, by id or name (names, the model's too, in any case)
    DELETE /v1/audio/voices/{voice}

A cloned voice is spoken by naming it (id or name) wherever a voice goes: ``session.update``,
``/v1/audio/speech``, the Python client and its adapters. An upload passes the admission every
request that spends engine time passes (``Gateway.admit``: Origin, readiness, credentials); the
others need the API key when auth is on, like ``/v1/models``. A model that cannot clone (the
embedded voice, a CustomVoice checkpoint) answers an upload with 501 ``cloning_not_supported``.

What one upload and one client may take (``ReferenceLimits``; bad audio has its own codes in
``reference_audio.py``, the store's quotas are in ``voices.py``):

| code | status | when |
|---|---|---|
| ``origin_not_allowed`` | 403 | a write (POST, DELETE) from a page of another origin while no ``--allow-origin`` is set |
| ``too_many_requests`` | 503 | ``max_uploads`` (4) uploads are under way, counted from before the body is read |
| ``quota_exceeded`` | 429 | this client has ``max_uploads_per_client`` (2) of them |
| ``upload_too_large`` | 413 | the body is over ``max_bytes`` + 80 KB (chunked too), a field over 8 KB, the fields over 16 KB |
| ``too_many_parts`` | 400 | the form has more than 16 parts |
| ``duplicate_field`` | 400 | a field comes twice (two audio files: which one is the voice?) |
| ``invalid_name`` | 400 | the name is not 1-64 printable characters, or starts with ``voice_`` in any case |
| ``body_timeout`` | 408 | the body took longer than 60 s |

A browser posts a form to any origin without asking first (multipart needs no CORS preflight),
so with no allow-list a write is taken only from a page of this server (its Origin's host and
port are the request's Host, the forwarded one behind a trusted proxy) or from a client that
sends no Origin (curl, the SDKs). Messages quote at most 100 characters of what a client sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from voicewire.engine import CloningNotSupported, EngineNotReady, ModelInfo

from .gateway import GATEWAY, Gateway, RequestError, error_response
from .http_api import OPENAI_VOICES, QWEN3_SPEAKERS
from .quotas import client_id
from .reference_audio import BadAudio, ReferenceLimits, decode_reference
from .voices import MAX_NAME_CHARS, MAX_TRANSCRIPT_CHARS, VoiceError, check_name

log = logging.getLogger("voicewire.voices")

UPLOAD_TIMEOUT_S = 60.0  # a 10 MB upload at 2 Mbit/s takes 40 s
MAX_PARTS = 16  # a voice form has 2 or 3: name, audio, transcript
MAX_FIELD_BYTES = 8 * 1024  # one field that is not the audio
MAX_FIELDS_BYTES = 16 * 1024  # every field that is not the audio, together
MAX_NAME_BYTES = 4 * MAX_NAME_CHARS  # UTF-8: up to 4 bytes a character
MAX_TRANSCRIPT_BYTES = 4 * MAX_TRANSCRIPT_CHARS
FORM_OVERHEAD_BYTES = 64 * 1024  # boundaries and part headers of MAX_PARTS parts, generously
ECHO_CHARS = 100  # of a client's input quoted back in an error message
AUDIO_FIELDS = ("audio", "file", "audio_sample")  # our name, OpenAI's for files, vLLM-Omni's
TRANSCRIPT_FIELDS = ("transcript", "ref_text")
DEFAULT_PORTS = {"http": 80, "https": 443}
# Uploads under way (from admission to the answer), by client: read by every upload's admission.
UPLOADS = web.AppKey("voicewire.voice_uploads", Counter)


def add_voice_routes(app: web.Application, base: str = "") -> None:
    app[UPLOADS] = Counter()
    app.router.add_get(f"{base}/v1/audio/voices", list_voices_handler)
    app.router.add_post(f"{base}/v1/audio/voices", create_voice_handler)
    app.router.add_get(f"{base}/v1/audio/voices/{{voice}}", get_voice_handler)
    app.router.add_delete(f"{base}/v1/audio/voices/{{voice}}", delete_voice_handler)


def _model_voices(info: ModelInfo) -> list[dict[str, Any]]:
    return [
        {"id": v, "name": v, "object": "voice", "type": "builtin", "default": i == 0}
        for i, v in enumerate(info.voices)
    ]


def _builtin(info: ModelInfo, key: str) -> dict[str, Any] | None:
    folded = key.strip().casefold()
    return next((v for v in _model_voices(info) if v["id"].casefold() == folded), None)


def _echo(text: str) -> str:
    """A client's input as an error message quotes it: repr, at most ECHO_CHARS of it."""
    return repr(text[:ECHO_CHARS]) + ("..." if len(text) > ECHO_CHARS else "")


def _keyed(request: web.Request) -> tuple[Gateway, ModelInfo] | web.Response:
    """The reading routes' admission (the API key when auth is on) and the served model; or the
    refusal to answer with."""
    gw = request.app[GATEWAY]
    refused = gw.check_key(request)
    if refused is not None:
        return refused
    try:
        return gw, gw.engine.info
    except EngineNotReady as err:
        return error_response(503, "not_ready", str(err))


def _foreign_write(gw: Gateway, request: web.Request) -> web.Response | None:
    """The refusal of a write from another origin's page when no allow-list is set (with one,
    ``check_origin`` decides); None for a same-origin page or a client that sends no Origin."""
    origin = request.headers.get("Origin")
    if origin is None or gw.auth.config.allowed_origins or _same_origin(origin, request):
        return None
    return gw.refuse(
        request,
        403,
        "origin_not_allowed",
        f"a page of origin {_echo(origin)} may not change voices here (--allow-origin lists those that may)",
    )


def _same_origin(origin: str, request: web.Request) -> bool:
    """The Origin's host and port are the request's Host (default ports filled in by scheme)."""
    try:
        page = urlsplit(origin)
        served = urlsplit(f"//{request.host}")
        page_at = (page.hostname, page.port or DEFAULT_PORTS.get(page.scheme))
        served_at = (served.hostname, served.port or DEFAULT_PORTS.get(request.scheme))
    except ValueError:  # a port that is not a number
        return False
    return page.scheme in DEFAULT_PORTS and page_at[0] is not None and page_at == served_at


async def list_voices_handler(request: web.Request) -> web.Response:
    keyed = _keyed(request)
    if isinstance(keyed, web.Response):
        return keyed
    gw, info = keyed
    cloned = [{**v.describe(), "default": False} for v in gw.voices.voices(info.voice_encoder)]
    return web.json_response(
        {"object": "list", "cloning": bool(info.voice_encoder), "data": [*_model_voices(info), *cloned]}
    )


async def get_voice_handler(request: web.Request) -> web.Response:
    keyed = _keyed(request)
    if isinstance(keyed, web.Response):
        return keyed
    gw, info = keyed
    key = request.match_info["voice"]
    builtin = _builtin(info, key)
    if builtin is not None:
        return web.json_response(builtin)
    voice = gw.voices.find(key, info.voice_encoder)
    if voice is None:
        return error_response(404, "voice_not_found", f"no voice {_echo(key)}")
    return web.json_response(voice.describe())


async def delete_voice_handler(request: web.Request) -> web.Response:
    keyed = _keyed(request)
    if isinstance(keyed, web.Response):
        return keyed
    gw, info = keyed
    refused = _foreign_write(gw, request)
    if refused is not None:
        return refused
    key = request.match_info["voice"]
    if _builtin(info, key) is not None:
        return error_response(
            400, "builtin_voice", f"{_echo(key)} is the model's own voice; it cannot be deleted"
        )
    voice = gw.voices.find(key, info.voice_encoder)
    if voice is None:
        return error_response(404, "voice_not_found", f"no voice {_echo(key)}")
    gw.voices.delete(voice)
    return web.json_response({"id": voice.id, "object": "voice", "deleted": True})


async def create_voice_handler(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    refused = _foreign_write(gw, request) or gw.admit(request, opens_session=False)
    if refused is not None:
        return _closing(refused)
    engine = gw.pick_engine()
    info = engine.info
    if not info.voice_encoder:
        names = ", ".join(info.voices)
        return _closing(
            error_response(
                501,
                "cloning_not_supported",
                f"the {info.name} model cannot clone voices; its voices: {names} "
                "(Qwen3-TTS Base checkpoints clone)",
            )
        )
    if request.content_type != "multipart/form-data":
        return _closing(
            error_response(
                415,
                "unsupported_media_type",
                "send the voice as multipart/form-data: name, audio, transcript",
            )
        )
    limits = gw.config.voice_limits
    if request.content_length is not None and request.content_length > _max_body_bytes(limits):
        return _closing(
            error_response(413, "upload_too_large", f"reference audio is limited to {limits.max_bytes} bytes")
        )
    # Taken before the body is read: a body in memory is what the limit bounds.
    uploads = request.app[UPLOADS]
    client = client_id(request, gw.auth.config.enabled)
    if uploads.total() >= limits.max_uploads:
        return _closing(
            gw.refuse(
                request, 503, "too_many_requests", f"at most {limits.max_uploads} voices are uploaded at once"
            )
        )
    per_client = limits.max_uploads_per_client
    if per_client and uploads[client] >= per_client:
        return _closing(
            gw.refuse(request, 429, "quota_exceeded", f"a client uploads at most {per_client} voices at once")
        )
    uploads[client] += 1
    try:
        return await _create_voice(request, gw, client, limits)
    finally:
        uploads[client] -= 1
        if uploads[client] <= 0:
            del uploads[client]


async def _create_voice(
    request: web.Request, gw: Gateway, client: str, limits: ReferenceLimits
) -> web.Response:
    try:
        fields = await asyncio.wait_for(_read_form(request, limits), UPLOAD_TIMEOUT_S)
    except RequestError as err:
        return _closing(err.response())
    except TimeoutError:
        return _closing(
            error_response(408, "body_timeout", f"the upload did not arrive within {UPLOAD_TIMEOUT_S:g} s")
        )
    except (ValueError, HttpProcessingError) as err:  # a malformed multipart body
        return _closing(
            error_response(400, "invalid_body", f"the body is not multipart/form-data: {_echo(str(err))}")
        )
    engine = gw.pick_engine()
    info = engine.info
    name = fields.get("name", b"").decode("utf-8", "replace")
    audio = next((fields[f] for f in AUDIO_FIELDS if f in fields), None)
    transcript = next((fields[f] for f in TRANSCRIPT_FIELDS if f in fields), b"").decode("utf-8", "replace")
    if not name.strip() or audio is None:
        return error_response(400, "missing_field", "a voice needs a name and an audio file")
    try:
        name = check_name(name)  # before the audio is decoded: a bad name costs nothing
        if name.casefold() in {v.casefold() for v in info.voices} | OPENAI_VOICES | QWEN3_SPEAKERS:
            raise VoiceError(409, "voice_name_taken", f"{name!r} names a built-in voice")
        ref = await decode_reference(audio, limits)
        if ref.clipped_samples:
            gw.log_limiter.log(
                log, "voice upload from %s: %d samples beyond full scale clipped", client, ref.clipped_samples,
                key="clipped_audio",
            )  # fmt: skip
        voice, created = await gw.voices.add(name, ref, transcript, engine, owner=client, limits=limits)
    except BadAudio as err:
        if err.code == "undecodable_audio":  # a decoder crash or hang: worth an operator's look
            gw.log_limiter.log(
                log, "voice upload from %s: %s", client, err.message, key=err.code, level=logging.WARNING
            )
        return error_response(err.status, err.code, err.message)
    except VoiceError as err:
        return error_response(err.status, err.code, err.message)
    except CloningNotSupported as err:
        return error_response(501, "cloning_not_supported", str(err))
    except EngineNotReady as err:
        return error_response(503, "not_ready", str(err))
    except ValueError as err:  # the model refused the clip
        return error_response(400, "bad_audio", str(err))
    except RuntimeError as err:
        return error_response(500, "model_error", f"cloning failed: {err}")
    return web.json_response({**voice.describe(), "created": created}, status=201 if created else 200)


def _max_body_bytes(limits: ReferenceLimits) -> int:
    return limits.max_bytes + MAX_FIELDS_BYTES + FORM_OVERHEAD_BYTES


async def _read_form(request: web.Request, limits: ReferenceLimits) -> dict[str, bytes]:
    """The form's fields by name (the ones this API reads), each read within its limit and the
    whole body within ``_max_body_bytes``: aiohttp's body limit does not cover multipart, and a
    chunked body has no Content-Length to refuse up front. Raises RequestError."""
    max_body = _max_body_bytes(limits)
    keep = {"name", *AUDIO_FIELDS, *TRANSCRIPT_FIELDS}
    fields: dict[str, bytes] = {}
    seen: set[str] = set()
    fields_bytes = parts = 0
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        parts += 1
        if parts > MAX_PARTS:
            raise RequestError(400, "too_many_parts", f"a voice form has at most {MAX_PARTS} parts")
        if not isinstance(part, BodyPartReader):
            raise RequestError(400, "invalid_body", "a voice form holds no nested multipart")
        name = part.name or ""
        if name in seen:
            raise RequestError(400, "duplicate_field", f"the field {_echo(name)} comes more than once")
        seen.add(name)
        limit, too_big = _field_limit(name, limits)
        data = bytearray()
        while chunk := await part.read_chunk(64 * 1024):
            data += chunk
            if len(data) > limit:
                raise too_big
            if request.content.total_bytes > max_body:
                raise RequestError(413, "upload_too_large", f"a voice upload is limited to {max_body} bytes")
        if name not in AUDIO_FIELDS:
            fields_bytes += len(data)
            if fields_bytes > MAX_FIELDS_BYTES:
                raise RequestError(
                    413, "upload_too_large", f"the form's fields are limited to {MAX_FIELDS_BYTES} bytes"
                )
        if name in keep:
            fields[name] = bytes(data)
        if request.content.total_bytes > max_body:  # part headers count too
            raise RequestError(413, "upload_too_large", f"a voice upload is limited to {max_body} bytes")
    return fields


def _field_limit(name: str, limits: ReferenceLimits) -> tuple[int, RequestError]:
    """A field's byte limit and the refusal past it."""
    if name in AUDIO_FIELDS:
        return limits.max_bytes, RequestError(
            413, "upload_too_large", f"reference audio is limited to {limits.max_bytes} bytes"
        )
    if name == "name":
        return MAX_NAME_BYTES, RequestError(
            400, "invalid_name", f"a voice name is 1 to {MAX_NAME_CHARS} printable characters"
        )
    if name in TRANSCRIPT_FIELDS:
        return MAX_TRANSCRIPT_BYTES, RequestError(
            400, "transcript_too_long", f"a transcript is limited to {MAX_TRANSCRIPT_CHARS} characters"
        )
    return MAX_FIELD_BYTES, RequestError(
        413, "upload_too_large", f"the field {_echo(name)} is limited to {MAX_FIELD_BYTES} bytes"
    )


def _closing(resp: web.Response) -> web.Response:
    # The rest of the body may still be on the wire: close instead of reading it.
    resp.force_close()
    return resp
