"""What the HTTP layer writes to the log: the access log, and aiohttp's own request errors.

Two rules hold for every line here:

* credentials never appear: a request's query is masked by ``auth.masked_path_qs`` (parsed and
  decoded, so no spelling escapes), headers are not logged, and an error that quotes the raw
  request (aiohttp's parser does) is cut before the quote;
* a client's bad requests cost a bounded number of lines: a client error's access line (4xx)
  and aiohttp's line for a request it could not parse go through the gateway's ``LogLimiter``,
  like every refusal (20 lines per code per 10 s, the rest counted in the next line). A flood
  of 3,000 malformed requests writes a few KB, not the megabytes of a traceback each.

aiohttp logs a request it cannot parse (a bad request line, a duplicate ``Content-Length``, a
header over 8 KiB, a broken chunked body) at ERROR with a traceback, from its request handler's
logger; ``make_runner`` (server.py) hands that handler a ``RequestErrorLog`` instead.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from .auth import masked_path_qs
from .log_limit import LogLimiter
from .proxy import client_address

MALFORMED = "malformed_request"  # the limiter's key for requests aiohttp could not parse
INTERNAL = "internal_error"  # the limiter's key for the server's own failures in a handler
MAX_REASON_CHARS = 80
# Where aiohttp's parser messages start quoting the request's bytes (which may hold a token).
_QUOTE = re.compile(r"[:'\"\n]")


def access_logger(limiter: LogLimiter) -> type[AbstractAccessLogger]:
    """The access log of one runner (aiohttp builds one per connection from the class)."""

    class AccessLogger(AbstractAccessLogger):
        """``CLIENT METHOD PATH STATUS BYTES TIMEms``, one line per request; a client error's line
        at ``limiter``'s rate, per status."""

        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            args = (
                client_address(request),
                request.method,
                masked_path_qs(request.rel_url),
                response.status,
                response.body_length,
                time * 1000,
            )
            line = "%s %s %s %d %d %.1fms"
            if 400 <= response.status < 500:
                limiter.log(self.logger, line, *args, key=f"access_{response.status}")
            else:
                self.logger.info(line, *args)

    return AccessLogger


class RequestErrorLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's request-handler logger (``aiohttp.server``) for one runner.

    A client's malformed request (an ``HttpProcessingError``) is one line at INFO, or at
    aiohttp's level if lower, without a traceback: it is the client's fault, and a traceback per
    request is what floods a disk. Anything else logged at ERROR is the server's own failure (a
    bug in a handler, answered 500) and keeps its traceback. Both go through ``limiter``.
    """

    def __init__(self, logger: logging.Logger, limiter: LogLimiter) -> None:
        super().__init__(logger, {})
        self._limiter = limiter

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        err = _exception(kwargs.get("exc_info"))
        if isinstance(err, HttpProcessingError):
            kwargs.pop("exc_info")
            self._limiter.log(
                self.logger,
                f"{msg}: %d %s (%s)",
                *args,
                err.code,
                _reason(err),
                type(err).__name__,
                key=MALFORMED,
                level=min(level, logging.INFO),
                **kwargs,
            )
        elif level >= logging.ERROR:
            self._limiter.log(self.logger, str(msg), *args, key=INTERNAL, level=level, **kwargs)
        else:
            self.logger.log(level, msg, *args, **kwargs)


def _exception(exc_info: object) -> BaseException | None:
    """The exception a logging call's ``exc_info`` names (an exception, a triple, or True)."""
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple):
        return exc_info[1] if len(exc_info) == 3 else None
    return sys.exc_info()[1] if exc_info else None


def _reason(err: HttpProcessingError) -> str:
    """What aiohttp's parser found wrong, cut where its message starts quoting the request."""
    return _QUOTE.split(err.message, maxsplit=1)[0].strip()[:MAX_REASON_CHARS] or "malformed"
