"""structlog setup shared by every mcad entry point.

Contract: ``configure(level, fmt)`` is called once at process start; afterwards ``structlog.get_logger()``
yields loggers that write one event per line to stderr, JSON for machines (the controller's default in a
cluster) or aligned key=value text for people. Messages are fixed strings; variable data goes in keys.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["json", "console"]


def configure(level: str = "info", fmt: LogFormat = "json") -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
