"""The scheduling core, sans-I/O: no asyncio, no clock, no randomness, no network."""

from engine.config import SchedulerConfig, default_config, parse_config
from engine.engine import Engine

__all__ = ["Engine", "SchedulerConfig", "default_config", "parse_config"]
