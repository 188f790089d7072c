"""The voices API: the model's own voices and the cloned ones (``voices.py``), OpenAI-style JSON.

    GET    /v1/audio/voices            the model's voices (the default first), then the cloned ones
    POST   /v1/audio/voices            multipart: name, audio (the reference clip), transcript (optional)
                                       -> 201 the new voice | 200 the voice of this reference, made before
    GET    /v1/audio/voices/{voice}    one voice, by id or name
    DELETE /v1/audio/voices/{voice}

A cloned voice is spoken by naming it (id or name) wherever a voice goes: ``session.update``,
``/v1/audio/speech``, the Python client and its adapters. An upload passes the admission every
request that spends engine time passes (``Gateway.admit``: Origin, readiness, credentials); the
others need the API key when auth is on, like ``/v1/models``. A model that cannot clone (the
embedded voice, a CustomVoice checkpoint) answers an upload with 501 ``cloning_not_supported``.
Bad audio has its own codes (``reference_audio.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import BodyPartReader, web

from voicewire.engine import CloningNotSupported, EngineNotReady, ModelInfo

from .gateway import GATEWAY, Gateway, error_response
from .http_api import OPENAI_VOICES, QWEN3_SPEAKERS
from .reference_audio import BadAudio, decode_reference
from .voices import VoiceError

UPLOAD_TIMEOUT_S = 60.0  # a 10 MB upload at 2 Mbit/s takes 40 s
MAX_FIELD_BYTES = 8 * 1024  # name and transcript
MAX_CLONES_UNDER_WAY = 4  # uploads being cloned at once (the engine clones one at a time)
AUDIO_FIELDS = ("audio", "file", "audio_sample")  # our name, OpenAI's for files, vLLM-Omni's
TRANSCRIPT_FIELDS = ("transcript", "ref_text")


def add_voice_routes(app: web.Application, base: str = "") -> None:
    app.router.add_get(f"{base}/v1/audio/voices", list_voices_handler)
    app.router.add_post(f"{base}/v1/audio/voices", create_voice_handler)
    app.router.add_get(f"{base}/v1/audio/voices/{{voice}}", get_voice_handler)
    app.router.add_delete(f"{base}/v1/audio/voices/{{voice}}", delete_voice_handler)


def _model_voices(info: ModelInfo) -> list[dict[str, Any]]:
    return [
        {"id": v, "name": v, "object": "voice", "type": "builtin", "default": i == 0}
        for i, v in enumerate(info.voices)
    ]


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
    builtin = next((v for v in _model_voices(info) if v["id"] == key), None)
    if builtin is not None:
        return web.json_response(builtin)
    voice = gw.voices.find(key, info.voice_encoder)
    if voice is None:
        return error_response(404, "voice_not_found", f"no voice {key!r}")
    return web.json_response(voice.describe())


async def delete_voice_handler(request: web.Request) -> web.Response:
    keyed = _keyed(request)
    if isinstance(keyed, web.Response):
        return keyed
    gw, info = keyed
    key = request.match_info["voice"]
    if key in info.voices:
        return error_response(400, "builtin_voice", f"{key!r} is the model's own voice; it cannot be deleted")
    voice = gw.voices.find(key, info.voice_encoder)
    if voice is None:
        return error_response(404, "voice_not_found", f"no voice {key!r}")
    gw.voices.delete(voice)
    return web.json_response({"id": voice.id, "object": "voice", "deleted": True})


async def create_voice_handler(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    refused = gw.admit(request, opens_session=False)
    if refused is not None:
        return refused
    engine = gw.pick_engine()
    info = engine.info
    if not info.voice_encoder:
        names = ", ".join(info.voices)
        return error_response(
            501,
            "cloning_not_supported",
            f"the {info.name} model cannot clone voices; its voices: {names} "
            "(Qwen3-TTS Base checkpoints clone)",
        )
    if request.content_type != "multipart/form-data":
        return error_response(
            415, "unsupported_media_type", "send the voice as multipart/form-data: name, audio, transcript"
        )
    limits = gw.config.voice_limits
    if request.content_length is not None and request.content_length > limits.max_bytes + MAX_FIELD_BYTES * 4:
        return _closing(
            error_response(413, "upload_too_large", f"reference audio is limited to {limits.max_bytes} bytes")
        )
    if gw.voices.pending >= MAX_CLONES_UNDER_WAY:
        return gw.refuse(
            request, 503, "too_many_requests", f"at most {MAX_CLONES_UNDER_WAY} voices are cloned at once"
        )
    try:
        fields = await asyncio.wait_for(_read_fields(request, limits.max_bytes), UPLOAD_TIMEOUT_S)
    except BadAudio as err:
        return _closing(error_response(err.status, err.code, err.message))
    except TimeoutError:
        return _closing(
            error_response(408, "body_timeout", f"the upload did not arrive within {UPLOAD_TIMEOUT_S:g} s")
        )
    except ValueError as err:  # a malformed multipart body
        return error_response(400, "invalid_body", f"the body is not multipart/form-data: {err}")
    name = fields.get("name", b"").decode("utf-8", "replace")
    audio = next((fields[f] for f in AUDIO_FIELDS if f in fields), None)
    transcript = next((fields[f] for f in TRANSCRIPT_FIELDS if f in fields), b"").decode("utf-8", "replace")
    if not name.strip() or audio is None:
        return error_response(400, "missing_field", "a voice needs a name and an audio file")
    if name.strip().casefold() in {v.casefold() for v in info.voices} | OPENAI_VOICES | QWEN3_SPEAKERS:
        return error_response(409, "voice_name_taken", f"{name.strip()!r} names a built-in voice")
    loop = asyncio.get_running_loop()
    try:
        ref = await loop.run_in_executor(None, decode_reference, audio, limits)
        voice, created = await gw.voices.add(name, ref, transcript, engine)
    except (BadAudio, VoiceError) as err:
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


async def _read_fields(request: web.Request, max_audio_bytes: int) -> dict[str, bytes]:
    """Every named part of the form, each read with its limit (aiohttp's body limit does not
    cover multipart streams): the audio's ``max_audio_bytes``, the rest ``MAX_FIELD_BYTES``."""
    fields: dict[str, bytes] = {}
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            return fields
        if not isinstance(part, BodyPartReader) or not part.name:
            continue  # a nested multipart, or an unnamed part: not ours
        limit = max_audio_bytes if part.name in AUDIO_FIELDS else MAX_FIELD_BYTES
        data = bytearray()
        while chunk := await part.read_chunk(64 * 1024):
            data += chunk
            if len(data) > limit:
                what = "reference audio" if part.name in AUDIO_FIELDS else f"field {part.name!r}"
                raise BadAudio(413, "upload_too_large", f"{what} is limited to {limit} bytes")
        fields[part.name] = bytes(data)


def _closing(resp: web.Response) -> web.Response:
    # The rest of the body is still on the wire: close instead of reading it.
    resp.force_close()
    return resp
